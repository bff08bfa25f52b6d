import type { RouteDef } from '../route';

export default [] as RouteDef[];
