// s3rver writes an object's file in place, so a GET that arrives during a PUT reads part of it (it even
// builds the object's metadata from the partial file). S3 never serves a partial object: PutObject is
// atomic, and job-file followers poll markers that are being written (lib/blob/followable.ts). Imported
// for its effect: s3rver's filesystem store then writes each object beside its place and renames it in.
import { randomUUID } from 'node:crypto';
import { rename } from 'node:fs/promises';
import FilesystemStore from 's3rver/lib/stores/filesystem.js';

const putInPlace = FilesystemStore.prototype.putObject;
const pathOf = (store, object) => store.getResourcePath(object.bucket, object.key, 'object');

FilesystemStore.prototype.putObject = async function putObjectAtomically(object) {
  const staged = { ...object, key: `${object.key}.staged-${randomUUID()}` };
  try {
    const written = await putInPlace.call(this, staged);
    // The new metadata first: until the rename a GET finds the old object (or none) by its file.
    await this.putMetadata(object.bucket, object.key, object.metadata, written.md5);
    await rename(pathOf(this, staged), pathOf(this, object));
    return written;
  } finally {
    await this.deleteObject(staged.bucket, staged.key).catch(() => undefined);
  }
};
