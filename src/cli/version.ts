// The project's version, written once in the Python package's VERSION file (main.ts runs the CLI
// on import, so it lives here).
import { readFileSync } from 'node:fs';
import { pythonPackageFile } from '../pmix/native.js';

export function projectVersion(): string {
  return readFileSync(pythonPackageFile('VERSION'), 'utf8').trim();
}
