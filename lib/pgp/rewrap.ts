import { Readable } from 'node:stream';
import * as openpgp from 'openpgp';
import { AppError, invalid } from '../errors';
import { integrityFailure } from './integrity';
import { AES_ECB } from './cfb';
import { MdcThread } from './mdc-thread';
import { CHUNK_BYTES, MIN_PARTIAL, Pull, malformed, packet, sessionKeyPackets, type SessionKeyPacket } from './packets';
import { sessionKeyPacket } from './pkesk';
import { sessionKeyV1 } from './session';
import { armorMessage, dearmor, sniffArmor } from './armor';
import { Watch, type WatchOptions } from './watch';

/**
 * Rewrap: a public-key encrypted SEIPDv1 message (gpg's, sq's, ours; binary or armored) is
 * addressed to another key by replacing its session-key packets (PKESK) for the old key with one for the
 * new key. The encrypted data packet is copied byte for byte (its framing included), so the cost is the
 * copy, whatever the size. While it is copied, the data is decrypted on the side (Node's AES-CFB) and its
 * MDC checked: a damaged or tampered message fails at its end, and the caller publishes only after a
 * clean end (the last chunk is also held back until then). Nothing of the plaintext leaves this module.
 *
 * Other shapes (SEIPDv2/AEAD, the unprotected SED packet, non-AES ciphers, compressed or signed outer
 * packets) are refused with 422 `unsupported_message`: re-encrypt them instead.
 */

const unsupported = (why: string) => invalid('unsupported_message', `This message cannot be rewrapped (${why}); use mode "reencrypt".`);

const TAG_PKESK = 1;
const TAG_SEIPD = 18;

export interface RewrapOpened {
  /** Whether the input was ASCII-armored (the output is too). */
  armored: boolean;
  /** Lowercase hex key ids of the message's public-key session key packets. */
  encryptionKeyIds: string[];
  /**
   * The message addressed to `recipient` instead of the key ids `from` (whose session key `oldKey`
   * opens). Session key packets for other recipients (and password packets) are kept, their contents as they
   * were (headers written anew; nothing covers them); markers are dropped. Call once.
   */
  rewrap(oldKey: openpgp.PrivateKey, from: string[], recipient: openpgp.PublicKey): Promise<Readable>;
}

/** Reads the session key packets and the SEIPD packet's tag octet (returned; the rest is left unread). */
async function readHead(r: Pull): Promise<{ packets: SessionKeyPacket[]; seipdTag: Buffer }> {
  const { packets, next } = await sessionKeyPackets(r);
  if (next === null) throw malformed('there is no encrypted data packet');
  if (next < 0) throw invalid('malformed_message', 'Not an OpenPGP message (neither armored nor binary packets).');
  if (next === 9) throw unsupported('its data is not integrity protected (SED)');
  if (next === 20) throw unsupported('AEAD encrypted data');
  if (next !== TAG_SEIPD) throw unsupported(`a packet of type ${next} before the encrypted data`);
  const notV3 = packets.find((p) => p.tag === TAG_PKESK && p.body[0] !== 3);
  if (notV3) throw unsupported(`a version ${notV3.body[0]} session key packet`);
  return { packets, seipdTag: Buffer.from(await r.take(1)) };
}

/**
 * Follows the framing of the SEIPD packet (everything after its tag octet) as raw chunks go by, handing
 * each body piece to `onBody`. Synchronous and copy-free: the chunks themselves are what is published.
 */
class FramingScanner {
  private state: 'length' | 'body' | 'done' | 'rest';
  private lengthOctets: number[] = [];
  private left = 0;
  private partial = false;

  constructor(
    ctb: number,
    private readonly onBody: (piece: Buffer) => void,
  ) {
    this.state = !(ctb & 0x40) && (ctb & 3) === 3 ? 'rest' : 'length';
    this.oldLength = ctb & 0x40 ? 0 : 1 << (ctb & 3);
  }

  private readonly oldLength: number;

  push(chunk: Buffer): void {
    let i = 0;
    while (i < chunk.length) {
      if (this.state === 'rest') return this.onBody(i ? chunk.subarray(i) : chunk);
      if (this.state === 'done') throw malformed('data after the encrypted packet');
      if (this.state === 'length') {
        this.lengthOctets.push(chunk[i++]);
        this.parseLength();
        continue;
      }
      const n = Math.min(this.left, chunk.length - i);
      this.onBody(chunk.subarray(i, i + n));
      i += n;
      this.left -= n;
      if (this.left === 0) this.state = this.partial ? 'length' : 'done';
    }
  }

  private parseLength(): void {
    const o = this.lengthOctets;
    let n: number | undefined;
    let partial = false;
    if (this.oldLength) {
      if (o.length === this.oldLength) n = o.reduce((v, b) => v * 256 + b, 0);
    } else {
      const f = o[0];
      if (f < 192) n = f;
      else if (f < 224) n = o.length === 2 ? ((f - 192) << 8) + o[1] + 192 : undefined;
      else if (f < 255) {
        n = 2 ** (f & 0x1f);
        partial = true;
        if (n < MIN_PARTIAL) throw malformed(`a partial body length below ${MIN_PARTIAL} octets`);
      } else n = o.length === 5 ? Buffer.from(o.slice(1)).readUInt32BE(0) : undefined;
    }
    if (n === undefined) return;
    this.lengthOctets = [];
    this.left = n;
    this.partial = partial;
    this.state = n > 0 ? 'body' : partial ? 'length' : 'done';
  }

  end(): void {
    if (this.state !== 'done' && this.state !== 'rest') throw malformed('the encrypted data packet is cut short');
  }
}

/**
 * Reads the head of a message (armored or binary) up to its encrypted data packet. Errors are AppError
 * 422 (malformed_message, unsupported_message); an error of `input` itself comes out unchanged.
 * `signal` and `idleMs` bound every OpenPGP.js call (lib/pgp/watch.ts).
 */
export async function openForRewrap(input: Readable, opts: WatchOptions = {}): Promise<RewrapOpened> {
  const watch = new Watch(input, opts);
  watch.check();
  const { armored, empty, chunks } = await sniffArmor(input);
  const r = new Pull((armored ? dearmor(chunks) : chunks)[Symbol.asyncIterator]());
  let parsed: Awaited<ReturnType<typeof readHead>>;
  try {
    if (empty) throw invalid('malformed_message', 'The message is empty.');
    parsed = await readHead(r);
  } catch (err) {
    input.destroy();
    watch.close();
    if (r.failed) throw r.failed;
    throw err;
  }
  const pkesks = parsed.packets.filter((p) => p.tag === TAG_PKESK);
  const keyIdOf = (p: SessionKeyPacket) => p.body.subarray(1, 9).toString('hex');
  if (!pkesks.length) {
    input.destroy();
    watch.close();
    throw invalid('malformed_message', 'The message is not encrypted to a public key.');
  }
  let used = false;
  return {
    armored,
    encryptionKeyIds: [...new Set(pkesks.map(keyIdOf))],
    async rewrap(oldKey, from, recipient) {
      if (used) throw new Error('rewrap() can be called once');
      used = true;
      const fromIds = new Set(from);
      const ours = pkesks.filter((p) => fromIds.has(keyIdOf(p)));
      let sessionKey: openpgp.SessionKey;
      let newPkesk: Uint8Array;
      try {
        if (!ours.length) throw invalid('no_matching_key', 'The message is not encrypted to this key.');
        const message = await watch.call(openpgp.readMessage({ binaryMessage: Buffer.concat(ours.map((p) => packet(p.tag, p.body))) }));
        sessionKey = await watch.call(sessionKeyV1(message, oldKey)).catch((err: unknown) => {
          throw err instanceof AppError ? err : invalid('no_matching_key', 'The message cannot be decrypted with this key.');
        });
        if (!sessionKey.algorithm || !AES_ECB[sessionKey.algorithm]) throw unsupported(`its cipher is ${sessionKey.algorithm ?? 'unknown'}, not AES`);
        newPkesk = await watch.call(sessionKeyPacket(recipient, sessionKey.algorithm, sessionKey.data));
      } catch (err) {
        input.destroy();
        watch.close();
        throw watch.failure ?? err;
      }
      const ecb = AES_ECB[sessionKey.algorithm];
      const pieces: Buffer[] = [];
      const scanner = new FramingScanner(parsed.seipdTag[0], (piece) => pieces.push(piece));
      const kept = parsed.packets.filter((p) => !(p.tag === TAG_PKESK && fromIds.has(keyIdOf(p))));
      async function* binary(): AsyncGenerator<Buffer> {
        yield Buffer.concat([Buffer.from(newPkesk), ...kept.map((p) => packet(p.tag, p.body)), parsed.seipdTag]);
        // The data packet as it came; the last chunk waits for the MDC check.
        let held: Buffer | undefined;
        // The MDC is checked on another thread while this one copies (lib/pgp/mdc-thread.ts).
        const check = new MdcThread(ecb, sessionKey.data);
        try {
          for await (const chunk of r.drain()) {
            scanner.push(chunk);
            for (const piece of pieces.splice(0)) await check.update(piece);
            if (held) yield held;
            held = chunk;
          }
          scanner.end();
          const verdict = await check.verify();
          // A failure of the decrypted data is the one integrity error, whatever its reason (integrity.ts).
          if (!verdict.ok) throw verdict.kind === 'tampered' ? integrityFailure() : { unsupported, malformed }[verdict.kind](verdict.why);
        } catch (err) {
          if (r.failed) throw r.failed;
          throw err;
        } finally {
          check.close(); // also when the reader stops early
        }
        if (held) yield held;
      }
      const out = Readable.from(armored ? armorMessage(binary()) : binary(), { objectMode: false, highWaterMark: CHUNK_BYTES });
      watch.onFail((err) => out.destroy(err));
      out.once('close', () => {
        watch.close();
        input.destroy();
      });
      return out;
    },
  };
}
