import { createReadStream, createWriteStream } from 'node:fs';
import { open, readFile } from 'node:fs/promises';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { pipeline } from 'node:stream/promises';
import type { Command } from 'commander';
import { problemFrom } from '../../client/http.js';
import { refuseExistingOutputs } from '../../client/index.js';
import { EvidenceVerifier, type ExportLine, type Jwk, type Verdict } from '../../lib/audit-chain.js';
import { connect, print } from '../context.js';
import { UsageError } from '../exit-codes.js';
import { examples, int, run } from './common.js';

/** The evidence does not hold: exit 1, after the verdict is printed. */
class EvidenceBroken extends Error {
  override readonly name = 'EvidenceBroken';
}

/** The sequence of the last whole row line of an export file, and the length up to the end of its last whole line. */
async function resumePoint(path: string): Promise<{ next: number; wholeBytes: number }> {
  let next = 1;
  let offset = 0;
  let wholeBytes = 0;
  const lines = createInterface({ input: createReadStream(path), crlfDelay: Infinity });
  for await (const line of lines) {
    offset += Buffer.byteLength(line) + 1;
    try {
      const parsed = JSON.parse(line) as ExportLine;
      if (parsed.type === 'row') next = parsed.sequence + 1;
      else if (parsed.type === 'header' && next === 1) next = parsed.from_sequence;
      wholeBytes = offset;
    } catch {
      break; // a line cut by the interruption: written again
    }
  }
  return { next, wholeBytes };
}

function describeVerdict(v: Verdict): string {
  if (v.first_break) return `BROKEN at row ${v.first_break.sequence}: ${v.first_break.reason}`;
  const span = v.rows ? `rows ${v.first_sequence} to ${v.last_sequence}` : 'no rows';
  const anchored =
    v.last_checkpoint_sequence === null ? 'no signed checkpoint yet' : `signed checkpoints up to row ${v.last_checkpoint_sequence} (${v.checkpoints} verified)`;
  return `OK: ${span} of ${v.chain}, ${anchored}; ${v.unanchored_rows} row(s) after the last checkpoint are protected by the chain alone`;
}

/** `kms audit export` and `kms audit verify`: the account's audit evidence, checked without trusting the service. */
export function registerAuditEvidence(audit: Command) {
  audit
    .command('export')
    .description('Download your audit chain with its signed checkpoints (NDJSON); --resume continues an interrupted file')
    .option('-o, --out <file>', 'write to this file (default: standard output)')
    .option('--from <sequence>', 'start at this row', int('--from'))
    .option('--resume', 'append to --out from the row after its last whole row')
    .option('-f, --force', 'replace --out if it exists')
    .addHelpText('after', examples('kms audit export -o audit.ndjson', 'kms audit export -o audit.ndjson --resume', 'kms audit verify audit.ndjson'))
    .action(
      run<{ out?: string; from?: number; resume?: boolean; force?: boolean }>(async (opts) => {
        if (opts.resume && !opts.out) throw new UsageError('--resume needs --out FILE');
        if (opts.resume && opts.force) throw new UsageError('--resume and --force exclude each other');
        if (opts.out && !opts.resume) await refuseExistingOutputs([opts.out], opts.force);
        if (opts.resume && opts.from !== undefined) throw new UsageError('--resume and --from exclude each other');
        if (opts.from !== undefined && opts.from < 1) throw new UsageError('--from must be at least 1');
        let from = opts.from ?? 1;
        let flags = 'w';
        if (opts.resume) {
          const point = await resumePoint(opts.out!).catch(() => ({ next: 1, wholeBytes: 0 }));
          const file = await open(opts.out!, 'a+');
          await file.truncate(point.wholeBytes);
          await file.close();
          from = point.next;
          flags = 'a';
        }
        const { kms } = await connect(opts);
        const res = await kms.rawRequest('GET', `/audit-logs/export?from_sequence=${from}`, { accept: 'application/x-ndjson' });
        if (res.statusCode !== 200) throw await problemFrom(res);
        if (opts.out) await pipeline(res, createWriteStream(opts.out, { flags }));
        else {
          res.pipe(process.stdout, { end: false });
          await once(res, 'end');
        }
      }),
    );

  audit
    .command('verify <file>')
    .description('Check an export offline: the chain, and each checkpoint against the published keys; exit 1 where the evidence breaks')
    .option('--keys <file>', 'the published keys (a saved GET /audit-logs/keys); default: fetched from the service')
    .option(
      '--checkpoints <file>',
      'checkpoints you kept earlier (NDJSON: an earlier export, audit_checkpoints.signed events or webhook bodies); each must still hold in the export',
    )
    .addHelpText(
      'after',
      examples(
        'kms audit verify audit.ndjson',
        'kms audit verify audit.ndjson --keys audit-keys.json --json',
        'kms audit verify audit.ndjson --keys audit-keys.json --checkpoints last-month.ndjson',
      ),
    )
    .action(
      run<{ keys?: string; checkpoints?: string }, [string]>(async (opts, file) => {
        const jwks = opts.keys ? (JSON.parse(await readFile(opts.keys, 'utf8')) as { keys: Jwk[] }) : await fetchKeys(opts);
        if (!Array.isArray(jwks.keys)) throw new UsageError('--keys must be a JWKS ({"keys": [...]})');
        const verifier = new EvidenceVerifier(jwks, opts.checkpoints ? await keptCheckpoints(opts.checkpoints) : []);
        let n = 0;
        for await (const line of createInterface({ input: createReadStream(file), crlfDelay: Infinity })) {
          n++;
          if (!line.trim()) continue;
          let parsed: ExportLine;
          try {
            parsed = JSON.parse(line) as ExportLine;
          } catch {
            throw new EvidenceBroken(`line ${n} of ${file} is not JSON (a cut or edited export)`);
          }
          if (!verifier.add(parsed)) break;
        }
        const verdict = verifier.verdict();
        print(opts, verdict, describeVerdict(verdict));
        if (!verdict.ok) throw new EvidenceBroken(`the audit evidence breaks at row ${verdict.first_break!.sequence}`);
      }),
    );
}

/** The compact JWSs of a file of kept checkpoints: any line with a `jws` (an export's checkpoint line, an event's data) or a `data.jws` (an event, a webhook body). */
async function keptCheckpoints(path: string): Promise<string[]> {
  const found: string[] = [];
  let n = 0;
  for await (const line of createInterface({ input: createReadStream(path), crlfDelay: Infinity })) {
    n++;
    if (!line.trim()) continue;
    let parsed: { jws?: unknown; data?: { jws?: unknown } };
    try {
      parsed = JSON.parse(line) as typeof parsed;
    } catch {
      throw new UsageError(`line ${n} of ${path} is not JSON`);
    }
    const jws = parsed?.jws ?? parsed?.data?.jws;
    if (typeof jws === 'string') found.push(jws);
  }
  if (!found.length) throw new UsageError(`${path} holds no checkpoint (lines with a "jws")`);
  return found;
}

async function fetchKeys(opts: Parameters<typeof connect>[0]): Promise<{ keys: Jwk[] }> {
  const { kms } = await connect(opts, { auth: false });
  return kms.data(kms.api.GET('/audit-logs/keys', {}));
}
