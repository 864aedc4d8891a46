// The project's version, from package.json (main.ts runs the CLI on import, so it lives here).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { projectRoot } from '../pmix/native.js';

export function projectVersion(): string {
  return (JSON.parse(readFileSync(join(projectRoot(), 'package.json'), 'utf8')) as { version: string }).version;
}
