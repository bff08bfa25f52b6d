/** Row MACs of the public key columns (see lib/integrity.ts), as the services and jobs use them. */
export { keyMac, lineageMac, verifiedKey, verifiedLineage } from '../integrity';
