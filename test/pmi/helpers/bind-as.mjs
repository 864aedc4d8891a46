// One PMI bind as the tests' other users (node bind-as.mjs PLAN_JSON, started with another uid):
// connects to plan.port on 127.0.0.1, or to the UNIX socket plan.path, writes plan.payload, then
// reads until the server closes ('read', the default), or closes at once ('close') or resets
// ('reset') once the payload is written. Prints one JSON line: its uid, what came back, any error,
// and whether it gave up waiting (plan.replyMs, default 5000).
import { connect } from 'node:net';

const plan = JSON.parse(process.argv[2]);
const s = plan.path ? connect(plan.path) : connect(plan.port, '127.0.0.1');
let text = '';
let error;
let timedOut = false;
s.on('connect', () => {
  s.write(plan.payload, 'latin1', () => {
    if (plan.mode === 'close') s.destroy();
    else if (plan.mode === 'reset') s.resetAndDestroy();
  });
});
s.on('data', (d) => (text += d.toString('latin1')));
s.on('error', (e) => (error = e.code ?? String(e)));
const timer = setTimeout(() => {
  timedOut = true;
  s.destroy();
}, plan.replyMs ?? 5000);
s.on('close', () => {
  clearTimeout(timer);
  console.log(JSON.stringify({ uid: process.getuid(), text, error, timedOut }));
});
