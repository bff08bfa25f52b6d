export declare const CONSOLE_BUDGET_GZIP: number;
/** Builds the console into `outdir`; resolves with its size and gzipped size in bytes. */
export declare function buildConsole(outdir: string): Promise<{ bytes: number; gzip: number }>;
