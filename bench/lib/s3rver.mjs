// A real S3-compatible server (s3rver) for `npm run bench -- --store s3`, in its own process so that
// its CPU is neither the bench client's nor the service's. Prints its port, then serves until killed.
import S3rver from 's3rver';
import '../../test/support/atomic-s3rver.mjs'; // PUTs atomic, as S3's

const [directory] = process.argv.slice(2);
const server = new S3rver({ address: '127.0.0.1', port: 0, silent: true, directory, configureBuckets: [{ name: 'kms-bench' }] });
const { port } = await server.run();
console.log(port);
