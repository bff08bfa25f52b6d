#!/usr/bin/env node
// The `kms` command (package.json "bin"). The CLI is TypeScript run through tsx, as the service is;
// tsx is resolved from this file's location, so `npx kms` works from any folder of the checkout.
import { register } from 'tsx/esm/api';

register();
await import('./main.ts');
