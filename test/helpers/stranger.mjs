// A local user who is not the sidecar's, trying every way in: run as another uid by the tests
// (node test/helpers/stranger.mjs PLAN_JSON). For each TCP port of the plan it holds `silent`
// connections that send nothing and sends each of the plan's payloads (hex) on a connection of its
// own, recording what came back; it tries to connect to each UNIX socket path. Prints one JSON
// line of results, holds the silent connections for `holdMs`, then prints a second line and exits.
import { connect } from 'node:net';

const plan = JSON.parse(process.argv[2]);
const results = { uid: process.getuid(), ports: {}, paths: {} };

function exchange(opts, payload) {
  return new Promise((resolve) => {
    const chunks = [];
    let error;
    const s = connect(opts, () => s.write(Buffer.from(payload, 'hex')));
    s.on('data', (d) => chunks.push(d));
    s.on('error', (e) => (error = e.code ?? String(e)));
    const timer = setTimeout(() => s.destroy(), plan.replyMs ?? 3000);
    s.on('close', () => {
      clearTimeout(timer);
      const reply = Buffer.concat(chunks);
      resolve({ error, bytes: reply.length, head: reply.subarray(0, 64).toString('hex'), text: reply.subarray(0, 1024).toString('latin1'), status: reply.length >= 4 ? reply.readInt32BE(0) : null });
    });
  });
}

const held = [];
for (const port of plan.ports) {
  for (let i = 0; i < plan.silent; i++) {
    const s = connect({ host: '127.0.0.1', port });
    s.on('error', () => undefined);
    held.push(s);
  }
}
for (const port of plan.ports) {
  results.ports[port] = {};
  for (const [name, hex] of Object.entries(plan.payloads)) results.ports[port][name] = await exchange({ host: '127.0.0.1', port }, hex);
}
for (const path of plan.paths) {
  results.paths[path] = await exchange({ path }, '00');
}
results.silentStillOpen = held.filter((s) => !s.destroyed).length;
console.log(JSON.stringify(results));
await new Promise((r) => setTimeout(r, plan.holdMs ?? 0));
console.log(JSON.stringify({ done: true, silentStillOpen: held.filter((s) => !s.destroyed).length }));
for (const s of held) s.destroy();
