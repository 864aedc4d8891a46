// One page for the sidecar's own `/` and the Dask dashboard's /dask-pmix/: it reads one relative
// URL, v1/dashboard (the scheduler relays exactly that route), once a second. Everything shown
// goes through textContent or the chart library.

const REFRESH_MS = 1000,
  MAX_JOBS = 25,
  WINDOW_S = 600,
  MIN_WINDOW_S = 30;
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem('dask-pmix-token') || '';
const charts = {};

// Colours of a job's bar: its outcome first (failed stands out), then its mode.
const OUTCOMES = [
  { key: 'failed', label: 'failed / aborted', color: '#d64541' },
  { key: 'running', label: 'running', color: '#3b7dd8' },
  { key: 'inprocess', label: 'completed, in-process', color: '#2e9b5f' },
  { key: 'fork', label: 'completed, fork', color: '#8fbf5a' },
];
const outcomeOf = (j) =>
  j.state === 'failed' || j.state === 'aborted'
    ? 'failed'
    : j.state === 'completed'
      ? j.mode === 'inprocess'
        ? 'inprocess'
        : 'fork'
      : 'running';

function headers() {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function get(path) {
  const r = await fetch(path, { headers: headers(), cache: 'no-store' });
  if (r.status === 401) {
    $('auth').style.display = 'block';
    throw new Error('the sidecar wants a token');
  }
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

function cell(text, cls) {
  const td = document.createElement('td');
  td.textContent = text === undefined || text === null ? '' : String(text);
  if (cls) td.className = cls;
  return td;
}

function fill(id, rows, columns, empty) {
  const body = $(id).tBodies[0];
  const fresh = document.createElement('tbody');
  for (const row of rows) {
    const tr = document.createElement('tr');
    for (const c of columns(row)) tr.appendChild(Array.isArray(c) ? cell(c[0], c[1]) : cell(c));
    fresh.appendChild(tr);
  }
  if (!rows.length) {
    const tr = document.createElement('tr');
    const td = cell(empty, 'empty');
    td.colSpan = $(id).tHead.rows[0].cells.length;
    tr.appendChild(td);
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
}

const short = (worker) => String(worker).replace(/^[a-z+]+:\/\//, '');
function bytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  for (; n >= 1024 && i < units.length - 1; i++) n /= 1024;
  return `${n >= 10 || i === 0 ? n.toFixed(0) : n.toFixed(1)} ${units[i]}`;
}
function ago(seconds) {
  const s = Math.round(-seconds);
  return s <= 0 ? 'now' : s < 60 ? `-${s}s` : `-${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}`;
}

// A chart is made once and then given new data: no flicker, no leaked canvases.
function chart(id, height, config) {
  $(`${id}-box`).style.height = `${height}px`;
  if (!charts[id]) {
    charts[id] = new Chart($(id), {
      ...config,
      options: { animation: false, responsive: true, maintainAspectRatio: false, ...config.options },
    });
  } else {
    charts[id].data = config.data;
    Object.assign(charts[id].options.scales, config.options.scales || {});
    charts[id].update('none');
  }
  return charts[id];
}

// A job that is an attempt of a family (run_mpi's retries): "attempt 2 of 3 of r1a2b...".
function attemptText(j) {
  const a = j.attempt;
  return a ? `attempt ${a.number}${a.of ? ` of ${a.of}` : ''} of ${a.family}` : '';
}

// The timeline: one row per worker, one bar per job it was a member of, from the job's start
// (or creation) to its end (or now), coloured by outcome and mode.
function showTimeline(view) {
  const now = Date.parse(view.now);
  const at = (iso) => (Date.parse(iso) - now) / 1000;
  const jobs = view.jobs.filter((j) => !j.endedAt || at(j.endedAt) > -WINDOW_S);
  const oldest = Math.min(-MIN_WINDOW_S, ...jobs.map((j) => at(j.startedAt || j.createdAt)));
  const workers = [
    ...new Set([...view.workers.map((w) => w.id), ...jobs.flatMap((j) => j.members.map((m) => m.workerId))]),
  ].sort();
  const bars = Object.fromEntries(OUTCOMES.map((o) => [o.key, []]));
  const span = -Math.max(oldest, -WINDOW_S);
  for (const j of jobs) {
    const start = Math.max(at(j.startedAt || j.createdAt), -WINDOW_S);
    const end = j.endedAt ? at(j.endedAt) : 0;
    for (const m of j.members) {
      // At least a 200th of the window wide, so that a job that failed at once still shows.
      bars[outcomeOf(j)].push({
        x: [start, Math.max(end, start + span / 200)],
        y: short(m.workerId),
        job: j.id,
        attempt: attemptText(j),
        rank: m.rank,
        mode: j.mode,
        impl: j.impl,
        state: j.state,
        member: m.state,
        error: j.error || m.reason || '',
      });
    }
  }
  const failed = jobs.filter((j) => outcomeOf(j) === 'failed').length;
  $('timeline-summary').textContent =
    `${jobs.length} jobs in the last ${Math.round(span)} s${failed ? `, ${failed} failed` : ''}`;
  chart('timeline', Math.max(140, 34 * workers.length + 70), {
    type: 'bar',
    data: {
      labels: workers.map(short),
      datasets: OUTCOMES.map((o) => ({
        label: o.label,
        data: bars[o.key],
        backgroundColor: o.color,
        borderColor: o.color,
        borderWidth: o.key === 'failed' ? 2 : 0,
        grouped: false,
        barPercentage: 0.7,
        categoryPercentage: 0.9,
      })),
    },
    options: {
      indexAxis: 'y',
      scales: {
        x: {
          type: 'linear',
          min: Math.max(oldest, -WINDOW_S),
          max: 0,
          ticks: { callback: (v) => ago(v) },
          title: { display: true, text: 'seconds ago' },
        },
        y: { type: 'category' },
      },
      plugins: {
        legend: { position: 'bottom' },
        tooltip: {
          callbacks: {
            label: (c) => {
              const d = c.raw;
              return (
                `${d.job}${d.attempt ? ` (${d.attempt})` : ''} rank ${d.rank}: ${d.mode}, ${d.impl}, ${d.state} ` +
                `(${(d.x[1] - d.x[0]).toFixed(2)} s)` +
                (d.error ? ` — ${d.error}` : '')
              );
            },
          },
        },
      },
    },
  });
}

// Each epoch's ranks handed out so far: in a running job, seated on an idle worker, or handed out to
// a worker that has gone (ranks are never reused); the label says how many are left.
function showEpochs(view) {
  const e = view.epochs;
  $('epochs-summary').textContent = e.length ? `${e.length} held` : '';
  $('epochs-note').textContent = e.length ? '' : 'no in-process pool (serve --pool-size 0, or MPICH / Intel MPI only)';
  const used = (x) => [x.busy, Math.max(0, x.seated - x.busy), Math.max(0, x.handedOut - x.seated)];
  const parts = ['in a running job', 'seated, idle', 'handed out, worker gone'];
  const colors = ['#3b7dd8', '#2e9b5f', '#b9bec7'];
  chart('epochs', Math.max(110, 40 * e.length + 70), {
    type: 'bar',
    data: {
      labels: e.map((x) => `epoch ${x.epoch} (${x.state}): ${x.size - x.handedOut} of ${x.size} free`),
      datasets: parts.map((label, i) => ({ label, data: e.map((x) => used(x)[i]), backgroundColor: colors[i] })),
    },
    options: {
      indexAxis: 'y',
      scales: {
        x: { stacked: true, ticks: { precision: 0 }, title: { display: true, text: 'ranks handed out' } },
        y: { stacked: true },
      },
      plugins: { legend: { position: 'bottom' } },
    },
  });
}

// Bytes each worker's comm backend moved (sent + received): over MPI, copied out of another
// worker's memory (a worker outside its host's cohort), and over TCP.
function showTraffic(view) {
  const ws = view.workers.filter((w) => w.traffic).sort((a, b) => a.id.localeCompare(b.id));
  const total = (w, t) => (w.traffic[t] ? w.traffic[t].bytesSent + w.traffic[t].bytesReceived : 0);
  const sum = (t) => ws.reduce((a, w) => a + total(w, t), 0);
  const [mpi, cma, tcp] = [sum('mpi'), sum('cma'), sum('tcp')];
  $('traffic-summary').textContent = ws.length ? `MPI ${bytes(mpi)}, single copy ${bytes(cma)}, TCP ${bytes(tcp)}` : '';
  $('traffic-note').textContent = ws.length
    ? ''
    : 'no worker reports: workers use the tcp+mpi:// comm backend (dask worker --protocol tcp+mpi)';
  chart('traffic', Math.max(110, 30 * ws.length + 70), {
    type: 'bar',
    data: {
      labels: ws.map((w) => short(w.id)),
      datasets: [
        { label: 'MPI', data: ws.map((w) => total(w, 'mpi')), backgroundColor: '#3b7dd8' },
        { label: 'TCP', data: ws.map((w) => total(w, 'tcp')), backgroundColor: '#e39b3b' },
        { label: 'single copy', data: ws.map((w) => total(w, 'cma')), backgroundColor: '#5aa55a' },
      ],
    },
    options: {
      indexAxis: 'y',
      scales: { x: { stacked: true, ticks: { callback: (v) => bytes(v) } }, y: { stacked: true } },
      plugins: {
        legend: { position: 'bottom' },
        tooltip: { callbacks: { label: (c) => `${c.dataset.label}: ${bytes(c.raw)}` } },
      },
    },
  });
}

function showTables(view) {
  const workers = view.workers;
  const seated = workers.filter((w) => w.pool);
  const epochs = new Set(seated.map((w) => w.pool.epoch));
  $('pool-summary').textContent =
    `${workers.length} workers, ${seated.length} pool ranks` +
    (epochs.size ? `, epoch ${[...epochs].sort((a, b) => a - b).join(', ')}` : '');
  fill(
    'pool',
    workers,
    (w) => [
      w.id,
      w.host,
      [w.state, `state ${w.state}`],
      w.jobId || '',
      w.pool ? w.pool.epoch : '',
      w.pool ? w.pool.rank : '',
      w.pool ? [w.pool.state, `state ${w.pool.state}`] : '',
    ],
    'no workers registered',
  );
  const notices = view.notices || [];
  $('notices-summary').textContent = notices.length ? `${notices.length} recent` : '';
  fill(
    'notices',
    notices,
    (n) => [new Date(n.time).toLocaleTimeString(), n.what, n.worker || '', n.reason],
    'nothing to report',
  );
  $('psets-summary').textContent = `${view.psets.length}`;
  fill('psets', view.psets, (p) => [p.name, p.members.join(', ')], 'no process sets defined');
  const active = view.jobs.filter((j) => ['pending', 'wiring', 'running'].includes(j.state)).length;
  $('jobs-summary').textContent = `${active} active, ${view.jobs.length} recent`;
  fill(
    'jobs',
    view.jobs.slice(0, MAX_JOBS),
    (j) => [
      j.id + (j.attempt ? ` (${attemptText(j)})` : ''),
      [j.state, `state ${j.state}`],
      j.impl,
      j.mode + (j.modeReason ? ` (${j.modeReason})` : ''),
      j.members.map((m) => `${m.rank}: ${m.workerId} ${m.state}`).join('; '),
      new Date(j.createdAt).toLocaleTimeString(),
      j.error || '',
    ],
    'no jobs yet',
  );
}

function show(view) {
  $('versions').textContent = `dask-pmix ${view.version} · PMIx ${view.pmixVersion}`;
  $('status').textContent = `${view.status === 'ok' ? 'live' : view.status} · ${new Date().toLocaleTimeString()}`;
  $('status').className = view.status === 'ok' ? '' : 'down';
  showTables(view);
  showTimeline(view);
  showEpochs(view);
  showTraffic(view);
}

// What the charts show, for tests and for anyone scripting the page.
window.daskPmix = {
  timeline: () =>
    charts.timeline
      ? charts.timeline.data.datasets.flatMap((d) =>
          d.data.map((b) => ({
            outcome: d.label,
            worker: b.y,
            job: b.job,
            rank: b.rank,
            mode: b.mode,
            state: b.state,
            seconds: b.x[1] - b.x[0],
          })),
        )
      : [],
  epochs: () =>
    charts.epochs
      ? charts.epochs.data.labels.map((label, i) => ({
          label,
          ...Object.fromEntries(charts.epochs.data.datasets.map((d) => [d.label, d.data[i]])),
        }))
      : [],
  traffic: () =>
    charts.traffic
      ? charts.traffic.data.labels.map((label, i) => ({
          worker: label,
          mpi: charts.traffic.data.datasets[0].data[i],
          tcp: charts.traffic.data.datasets[1].data[i],
          cma: charts.traffic.data.datasets[2].data[i],
        }))
      : [],
};

async function poll() {
  try {
    show(await get('v1/dashboard'));
  } catch (err) {
    $('status').textContent = `not reachable: ${err.message}`;
    $('status').className = 'down';
  }
  setTimeout(poll, REFRESH_MS);
}

$('auth').addEventListener('submit', (ev) => {
  ev.preventDefault();
  token = $('token').value;
  sessionStorage.setItem('dask-pmix-token', token);
  $('auth').style.display = 'none';
});
poll();
