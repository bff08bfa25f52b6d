// Lint: ESLint with typescript-eslint's type-aware rules (it reads the tsconfig projects). Layout is
// Prettier's (.prettierrc.json): the rules here are about behaviour.
import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['**/node_modules/', '**/dist/', 'coverage/', 'var/', '.build-test-*/', 'client/openapi.ts', 'web/passkeys/*.js'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: { globals: globals.node, parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      // An async function without `await` is how an implementation of an async interface turns its throws into rejections.
      '@typescript-eslint/require-await': 'off',
      // `_`-prefixed names are deliberately unused (a parameter a signature must have).
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
    },
  },
  {
    // Tests read JSON bodies as `any` on purpose: the assertions are their types.
    files: ['test/**/*.ts'],
    rules: {
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-explicit-any': 'off',
    },
  },
  {
    files: ['web/console/src/**/*.{ts,tsx}'],
    languageOptions: { globals: globals.browser },
    // An async event handler in JSX is how the pages act; its promise's errors are caught inside.
    rules: { '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: { attributes: false } }] },
  },
  { files: ['**/*.mjs', '**/*.js'], ...tseslint.configs.disableTypeChecked },
);
