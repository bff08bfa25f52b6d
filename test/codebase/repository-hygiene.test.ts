/**
 * The project's files speak of the code, never of how it came to be: no issue numbers, no numbered or
 * ordinal work sessions, no "this VM" or "the bench machine". A comment states an invariant or a reason;
 * a measurement lives in docs/performance.md, with the conditions that make it reproducible.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

const ORDINAL =
  '(?:\\d+(?:st|nd|rd|th)|first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|' +
  '[a-z]+teenth|[a-z]*tieth|(?:twenty|thirty|forty)-[a-z]+)';

/** Each pattern names one kind of history; HTTP sessions ("the session token", "earlier sessions were signed out") pass. */
const PATTERNS: Array<{ name: string; re: RegExp }> = [
  { name: 'an issue number', re: /\bissues?\s+#?\d+/i },
  { name: 'a numbered work session', re: new RegExp(`\\b${ORDINAL}\\s+session(?:'s|s)?\\b(?!\\s+(?:token|cookie|id)\\b)`, 'i') },
  { name: 'a numbered work session', re: /\bsessions?\s+\d{1,2}(?:\s*[–-]\s*\d{1,2})?(?!\d)(?![\d\s]*(?:ms|s|seconds|minutes)\b)/i },
  { name: 'a work session long ago', re: /\bsessions?\s+ago\b/i },
  { name: 'a virtual machine the project ran on', re: /\bVMs?\b/ },
  { name: 'the machine the project ran on', re: /\b(?:this|these|that|those|the bench|the shared|the development|our)\s+machines?\b/i },
];

/** This file spells the patterns out; the lock file is npm's. */
const SKIPPED = new Set(['test/codebase/repository-hygiene.test.ts', 'package-lock.json']);

function trackedTextFiles(): string[] {
  const out = execFileSync('git', ['ls-files', '-z'], { cwd: process.cwd(), encoding: 'utf8' });
  return out.split('\0').filter((f) => f !== '' && !SKIPPED.has(f) && !/\.(?:png|jpe?g|gif|ico|gpg|pgp|bin|tgz|gz)$/i.test(f));
}

function findings(): string[] {
  const found: string[] = [];
  for (const file of trackedTextFiles()) {
    let text: string;
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      continue; // deleted in the working tree but still in the index
    }
    if (text.includes('\0')) continue;
    text.split('\n').forEach((line, i) => {
      for (const { name, re } of PATTERNS) {
        if (re.test(line)) found.push(`${file}:${i + 1}: ${name}: ${line.trim().slice(0, 160)}`);
      }
    });
  }
  return found;
}

describe('repository hygiene', () => {
  it('no tracked file names issue numbers, work sessions or the machine the project was measured on', () => {
    expect(findings()).toEqual([]);
  });

  it('the patterns catch what they are meant to and spare HTTP sessions', () => {
    const hits = (line: string) => PATTERNS.filter(({ re }) => re.test(line)).map(({ name }) => name);
    expect(hits('the worker follows the upload (issue 13)')).toEqual(['an issue number']);
    expect(hits('two runs of the twenty-third session')).toEqual(['a numbered work session']);
    expect(hits('since the eleventh session the keys are made on Node')).toEqual(['a numbered work session']);
    expect(hits('(sessions 11–18 and 23, 256 MiB)')).toEqual(['a numbered work session']);
    expect(hits('on these VMs a fresh page is a host fault')).toEqual(['a virtual machine the project ran on']);
    expect(hits('the kernel of this machine')).toEqual(['the machine the project ran on']);
    expect(hits('All earlier sessions were signed out and any partner API key revoked')).toEqual([]);
    expect(hits('answers a session token and a partner API key, shown once')).toEqual([]);
    expect(hits('the first session token a login issues')).toEqual([]);
    expect(hits('GET /sessions ends 2 sessions; session 30 s skew')).toEqual([]);
    expect(hits('stores the session 0600 in XDG_CONFIG_HOME')).toEqual([]);
  });
});
