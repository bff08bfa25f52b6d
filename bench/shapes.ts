/**
 * The `shapes` section's measurements (bench/lib/shapes.ts) in this process, as `npm run bench` runs them
 * in a child under the worker's node flags: `tsx bench/shapes.ts <input file> <bytes> <temp dir> <runs>`.
 * Prints the results as one JSON line, last.
 */
import { measureShapes } from './lib/shapes';

const [input, size, dir, runs] = process.argv.slice(2);
if (!input || !size || !dir || !runs) throw new Error('usage: tsx bench/shapes.ts <input file> <bytes> <temp dir> <runs>');
console.log(JSON.stringify(await measureShapes(input, Number(size), dir, Number(runs))));
