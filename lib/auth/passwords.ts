import { hash, verify } from '@node-rs/argon2';

const ARGON2ID = 2; // Algorithm.Argon2id (a const enum, which isolatedModules cannot import)

/** argon2id with OWASP's minimum (19 MiB, t=2, p=1); memory is configurable upwards (ARGON2_MEMORY_KIB). */
export function hashPassword(password: string, memoryKib: number): Promise<string> {
  return hash(password, { algorithm: ARGON2ID, memoryCost: memoryKib, timeCost: 2, parallelism: 1 });
}

export async function verifyPassword(stored: string, password: string): Promise<boolean> {
  try {
    return await verify(stored, password);
  } catch {
    return false;
  }
}

// A valid hash to verify against when the account does not exist, so that "unknown user" and "wrong
// password" take the same time and cannot be told apart.
let dummy: Promise<string> | undefined;
export function dummyHash(memoryKib: number): Promise<string> {
  dummy ??= hashPassword('not-a-real-password-0000', memoryKib);
  return dummy;
}
