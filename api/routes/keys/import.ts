import { z } from 'zod';
import { route } from '../../route';
import { Environment, Key, Label, Passphrase } from '../../schemas/key-fields';
import { invalid } from '../../../lib/errors';
import { importKey } from '../../../lib/keys/key-import';
import { keyOut } from '../../../lib/keys/key-view';
import { MAX_PUBLIC_KEY_BYTES } from '../../../lib/pgp/keys';

const tags = ['PGP keys'];

const ImportForm = z.object({
  key: z
    .string()
    .max(MAX_PUBLIC_KEY_BYTES)
    .optional()
    .describe('The transferable key (armored, or binary as a file part): a secret key (gpg --export-secret-keys, sq key generate) or a public key'),
  key_passphrase: z.string().min(1).max(1024).optional().describe('What unlocks the key as sent, when it is protected; used once, never stored'),
  passphrase: Passphrase.optional().describe('The passphrase the key will have here (a secret key only; same rules as generate-key)'),
  label: Label,
  environment: Environment.optional().describe('Default: production'),
});

export default [
  route({
    method: 'post',
    path: '/keys/import',
    summary:
      'Import an OpenPGP key: a secret key becomes a managed key (its first generation is the imported key); a public key becomes a recipient key (encrypt and verify only)',
    tags,
    access: 'auth',
    scope: 'keys:write',
    multipart: {
      description:
        'Fields: key (a file part or text), key_passphrase, passphrase, label, environment (JSON with the same fields, key armored, is accepted too)',
      binaryFields: ['key'],
    },
    body: ImportForm,
    responses: {
      201: { description: 'The imported key', schema: Key },
      200: { description: "The secret key of one of the account's recipient keys: that key (its `lineage_id`), now a managed key", schema: Key },
    },
    async handler({ c, user, body, upload, meta }) {
      const parts = upload.parts.key ?? (body.key ? [Buffer.from(body.key)] : []);
      if (parts.length !== 1) throw invalid('key_required', 'Send exactly one key in the field `key`.');
      const stored = await importKey(
        c,
        user.id,
        { key: parts[0], keyPassphrase: body.key_passphrase, passphrase: body.passphrase, label: body.label, environment: body.environment ?? 'production' },
        meta,
      );
      return { status: stored.upgraded ? 200 : 201, body: keyOut(stored.lineage, stored.key, c.clock.now()) };
    },
  }),
];
