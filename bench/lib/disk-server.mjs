// What a user would run instead of the service to move a file to a machine and back: a plain HTTP server
// that writes each PUT body to a file in a folder and serves it back on GET (the `v6` section's scripted
// baseline), in its own process so that its CPU is its own. Prints its port, then serves until killed.
import { createReadStream, createWriteStream } from 'node:fs';
import { createServer } from 'node:http';
import { basename, join } from 'node:path';
import { pipeline } from 'node:stream/promises';

const [directory] = process.argv.slice(2);
const server = createServer((req, res) => {
  const file = join(directory, basename(new URL(req.url ?? '/', 'http://x').pathname));
  const answer = (status) => res.writeHead(status).end();
  if (req.method === 'PUT')
    pipeline(req, createWriteStream(file, { highWaterMark: 1 << 20 })).then(
      () => answer(201),
      () => answer(500),
    );
  else if (req.method === 'GET') {
    res.writeHead(200, { 'content-type': 'application/octet-stream' });
    pipeline(createReadStream(file, { highWaterMark: 1 << 20 }), res).catch(() => res.destroy());
  } else answer(405);
});
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
