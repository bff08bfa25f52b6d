/**
 * The service's OpenAPI document built in-process from the route list, exactly as GET
 * /api/v1/openapi.json serves it, without the deployment's server URL (which changes no type). The
 * client's types (client/openapi.ts, `npm run client:types`) are generated from it;
 * test/interface/generated-client.test.ts checks it equals what the service serves.
 */
import type { OpenAPI3 } from 'openapi-typescript';
import { API_PREFIX, routes } from '../api/app';
import { openApiDocument } from '../api/route';

export function openApiForTypes(): OpenAPI3 {
  return openApiDocument(routes, { title: 'Key management and file encryption service', version: '1.0.0', serverUrl: API_PREFIX }) as unknown as OpenAPI3;
}
