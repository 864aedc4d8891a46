// Compiles the test clients once per run (skipped when their sources have not changed).
import { buildClients } from './build-clients.js';

export default async function setup(): Promise<void> {
  await buildClients();
}
