import { createHash, generateKeyPairSync, randomBytes, sign, type KeyObject } from 'node:crypto';
import { encodeCbor } from './cbor';

/**
 * A software WebAuthn authenticator (ES256, 'none' attestation) built from Node's crypto, for flow
 * tests: it makes the attestationObject and assertions a browser would send, and every field a
 * hostile or broken client could get wrong can be set (origin, RP id, flags, counter, challenge).
 */
const sha256 = (data: Buffer | string) => createHash('sha256').update(data).digest();
const b64u = (b: Buffer) => b.toString('base64url');

const FLAG_UP = 0x01;
const FLAG_UV = 0x04;
const FLAG_BE = 0x08;
const FLAG_BS = 0x10;
const FLAG_AT = 0x40;

export interface CeremonyOptions {
  /** The page origin the "browser" reports (clientDataJSON.origin). */
  origin: string;
  /** The RP id whose hash goes into authenticatorData. */
  rpId?: string;
  /** Default true. */
  userVerified?: boolean;
  /** Overrides the challenge taken from the options (a replay of another challenge). */
  challenge?: string;
  /** clientDataJSON.type; default the ceremony's own. */
  type?: string;
}

export class SoftAuthenticator {
  readonly credentialId = randomBytes(32);
  private readonly privateKey: KeyObject;
  readonly cosePublicKey: Buffer;
  /** Signature counter; each assertion adds one first (set it to test a clone going backwards). */
  counter = 0;
  /** The user handle the RP gave at registration (sent back in assertions, as platform passkeys do). */
  userHandle?: string;

  constructor(readonly opts: { rpId: string; backupEligible?: boolean; aaguid?: Buffer } = { rpId: 'localhost' }) {
    const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    this.privateKey = privateKey;
    // The uncompressed point (04 ‖ x ‖ y) ends the SPKI form. Not a JWK export: in Node 20 that can deadlock
    // on a key from generateKeyPairSync (lib/curve25519.ts).
    const point = publicKey.export({ format: 'der', type: 'spki' }).subarray(-65);
    // COSE_Key: kty EC2 (2), alg ES256 (-7), crv P-256 (1), x, y.
    this.cosePublicKey = encodeCbor(
      new Map<number, number | Uint8Array>([
        [1, 2],
        [3, -7],
        [-1, 1],
        [-2, point.subarray(1, 33)],
        [-3, point.subarray(33)],
      ]),
    );
  }

  get id(): string {
    return b64u(this.credentialId);
  }

  private authData(rpId: string, flags: number, counter: number, attested?: Buffer): Buffer {
    const c = Buffer.alloc(4);
    c.writeUInt32BE(counter >>> 0);
    return Buffer.concat([sha256(rpId), Buffer.from([flags]), c, ...(attested ? [attested] : [])]);
  }

  private flags(o: CeremonyOptions): number {
    let f = FLAG_UP;
    if (o.userVerified !== false) f |= FLAG_UV;
    if (this.opts.backupEligible) f |= FLAG_BE | FLAG_BS;
    return f;
  }

  private clientData(type: string, challenge: string, origin: string): Buffer {
    return Buffer.from(JSON.stringify({ type, challenge, origin, crossOrigin: false }));
  }

  /** navigator.credentials.create(): the RegistrationResponseJSON for creation options. */
  register(options: { challenge: string; user: { id: string } }, o: CeremonyOptions) {
    this.userHandle = options.user.id;
    const idLen = Buffer.alloc(2);
    idLen.writeUInt16BE(this.credentialId.length);
    const attested = Buffer.concat([this.opts.aaguid ?? Buffer.alloc(16), idLen, this.credentialId, this.cosePublicKey]);
    const authData = this.authData(o.rpId ?? this.opts.rpId, this.flags(o) | FLAG_AT, this.counter, attested);
    const clientDataJSON = this.clientData(o.type ?? 'webauthn.create', o.challenge ?? options.challenge, o.origin);
    const attestationObject = encodeCbor({ fmt: 'none', attStmt: {}, authData });
    return {
      id: this.id,
      rawId: this.id,
      type: 'public-key' as const,
      response: { clientDataJSON: b64u(clientDataJSON), attestationObject: b64u(attestationObject), transports: ['internal', 'hybrid'] },
      authenticatorAttachment: 'platform' as const,
      clientExtensionResults: {},
    };
  }

  /** navigator.credentials.get(): the AuthenticationResponseJSON for request options. */
  assert(options: { challenge: string }, o: CeremonyOptions & { counter?: number; userHandle?: string | null }) {
    this.counter = o.counter ?? this.counter + 1;
    const authData = this.authData(o.rpId ?? this.opts.rpId, this.flags(o), this.counter);
    const clientDataJSON = this.clientData(o.type ?? 'webauthn.get', o.challenge ?? options.challenge, o.origin);
    // ECDSA over authenticatorData || SHA-256(clientDataJSON), DER-encoded as WebAuthn sends it.
    const signature = sign('sha256', Buffer.concat([authData, sha256(clientDataJSON)]), this.privateKey);
    const handle = o.userHandle === null ? undefined : (o.userHandle ?? this.userHandle);
    return {
      id: this.id,
      rawId: this.id,
      type: 'public-key' as const,
      response: {
        clientDataJSON: b64u(clientDataJSON),
        authenticatorData: b64u(authData),
        signature: b64u(signature),
        ...(handle ? { userHandle: handle } : {}),
      },
      authenticatorAttachment: 'platform' as const,
      clientExtensionResults: {},
    };
  }
}
