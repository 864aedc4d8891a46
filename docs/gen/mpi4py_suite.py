"""The tables of "mpi4py's test suite in process" (docs/compatibility.md), from
compat-matrix/results/mpi4py-suite-<impl>.json (compat-matrix/mpi4py_suite/run.py writes them)
and compat-matrix/mpi4py_suite/known.json, the hand-kept explanations of known differences keyed
by test id (or an fnmatch pattern of test ids), so that rerunning the suite keeps them.

    python docs/gen/mpi4py_suite.py > docs/_generated/mpi4py-suite.md
"""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "compat-matrix" / "results"
KNOWN = ROOT / "compat-matrix" / "mpi4py_suite" / "known.json"
IMPLS = {"openmpi": "Open MPI", "mpich": "MPICH"}
CONFIGS = ("mpiexec", "inprocess", "fork")
LABEL = {"mpiexec": "mpiexec", "inprocess": "in-process", "fork": "fork"}
NOT_PASSED = {"error", "fail", "xpass", "hang", "crash", "absent"}
PASSED = {"pass", "xfail"}
MAX_LISTED = 4


def known(impl: str) -> dict[str, str]:
    doc = json.loads(KNOWN.read_text()) if KNOWN.is_file() else {}
    return {**doc.get("all", {}), **doc.get(impl, {})}


def explain(test_id: str, notes: dict[str, str]) -> str | None:
    if test_id in notes:
        return notes[test_id]
    for pattern, text in notes.items():
        if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(test_id, pattern):
            return text
    return None


def _cell(rec: dict | None) -> str:
    if rec is None:
        return "-"
    counts = rec["counts"]
    passed = counts.get("pass", 0) + counts.get("xfail", 0)
    bad = sum(v for k, v in counts.items() if k in NOT_PASSED)
    text = f"{passed}"
    if bad:
        text += f" ({bad} not)"
    if rec["status"] != "ok":
        text += f", {rec['status']}"
    deaths = rec.get("worker_deaths")
    if deaths:
        text += f", {deaths} worker{'s' if deaths != 1 else ''} died"
    return text


def _short(test_id: str, module: str) -> str:
    return test_id[len(module) + 1 :] if test_id.startswith(module + ".") else test_id


def _esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def regressions(mod: dict) -> dict[str, dict]:
    """Tests that pass under mpiexec and do not (fail, raise, hang, skip or do not run) in-process
    or in fork mode."""
    out = {}
    for test_id, row in mod["differences"].items():
        if row.get("mpiexec") not in PASSED:
            continue
        if any(row.get(c, "absent") not in PASSED for c in ("inprocess", "fork") if c in row):
            out[test_id] = row
    return out


def _reason(mod: dict, config: str, test_id: str) -> str:
    t = mod["configs"].get(config, {}).get("not_passed", {}).get(test_id)
    if not t:
        return ""
    text = t.get("message", "")
    if t.get("where"):
        text += f" ({t['where']})"
    return text


def impl_section(impl: str, doc: dict) -> list[str]:
    notes = known(impl)
    configs = [c for c in CONFIGS if c in doc["configs"]]
    lines = [f"### {IMPLS[impl]}: {doc.get('library', impl)}", ""]
    m0, m1 = doc.get("machine_start", {}), doc.get("machine_end", {})
    lines.append(
        f"{doc['suite']}, {doc['ranks']} ranks, every module a fresh job (or launch) with a {doc['timeout_s']:.0f} s "
        f"timeout; run at {doc['git']['commit']}{' with local changes' if doc['git'].get('dirty') else ''} on "
        f"{doc['generatedAt'][:10]} in {doc['seconds'] / 60:.0f} min, {m0.get('cores', '?')} cores, load "
        f"{m0.get('load', ['?'])[0]} at the start and {m1.get('load', ['?'])[0]} at the end "
        f"(`compat-matrix/results/mpi4py-suite-{impl}.json`). A cell is the number of tests passing on every rank, "
        "and in brackets those that failed, raised, hung or did not run because the module's job ended early."
    )
    lines.append("")
    for c in configs:
        lines.append(f"- {LABEL[c]}: `{doc['configs'][c]}`")
    lines.append("")
    head = ["module", *(LABEL[c] for c in configs), "seconds", "differences from mpiexec", "explanation"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    totals = {c: [0, 0] for c in configs}
    unexplained = 0
    for module, mod in doc["modules"].items():
        recs = {c: mod["configs"].get(c) for c in configs}
        for c, r in recs.items():
            if r:
                totals[c][0] += r["counts"].get("pass", 0) + r["counts"].get("xfail", 0)
                totals[c][1] += r.get("worker_deaths", 0)
        diff = regressions(mod)
        names, why = [], []
        for test_id, row in diff.items():
            where = ", ".join(
                f"{LABEL[c]}: {row.get(c, 'absent')}"
                for c in ("inprocess", "fork")
                if row.get(c, "absent") not in PASSED
            )
            names.append(f"`{_short(test_id, module)}` ({where})")
            text = explain(test_id, notes)
            if text is None:
                unexplained += 1
                text = "not explained yet"
            if text not in why:
                why.append(text)
        if len(names) > MAX_LISTED:
            names = [*names[:MAX_LISTED], f"and {len(names) - MAX_LISTED} more"]
        seconds = " / ".join(f"{recs[c]['seconds']:.1f}" if recs[c] else "-" for c in configs)
        row = [
            f"`{module}`",
            *(_cell(recs[c]) for c in configs),
            seconds,
            _esc("; ".join(names)) or "none",
            _esc("; ".join(why)),
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines.append(
        "| total | "
        + " | ".join(f"{p}" + (f", {d} worker deaths" if d else "") for p, d in totals.values())
        + " | | | |"
    )
    lines.append("")
    if "mpiexec" in totals and totals["mpiexec"][0]:
        ref = totals["mpiexec"][0]
        parts = [
            f"{LABEL[c]} {totals[c][0]} ({100 * totals[c][0] / ref:.1f}%), "
            + (f"{totals[c][1]} worker deaths" if totals[c][1] else "no worker died")
            for c in configs
            if c != "mpiexec"
        ]
        lines += [f"Passing tests against mpiexec's {ref} in the same run: " + "; ".join(parts) + ".", ""]
    lines += differences_table(impl, doc, notes)
    if unexplained:
        lines += [f"{unexplained} differences have no entry in `compat-matrix/mpi4py_suite/known.json` yet.", ""]
    return lines


def differences_table(impl: str, doc: dict, notes: dict[str, str]) -> list[str]:
    """Every test that passes under mpiexec but not in-process or in fork mode, with its reason;
    the tests of a module with the same outcomes, reason and explanation share one row."""
    rows = []
    for module, mod in doc["modules"].items():
        groups: dict[tuple, list[str]] = {}
        for test_id, row in regressions(mod).items():
            outcomes = " / ".join(row.get(c, "-") for c in ("mpiexec", "inprocess", "fork") if c in row)
            reason = _reason(mod, "inprocess", test_id) or _reason(mod, "fork", test_id)
            key = (outcomes, reason.split(" (")[0], explain(test_id, notes) or "")
            groups.setdefault(key, []).append((test_id, reason))
        for (outcomes, _, why), tests in groups.items():
            first, reason = tests[0]
            name = f"`{first}`" + (f" and {len(tests) - 1} more of `{module}`" if len(tests) > 1 else "")
            rows.append(f"| {name} | {outcomes} | {_esc(reason)} | {_esc(why)} |")
    if not rows:
        return []
    configs = " / ".join(LABEL[c] for c in CONFIGS if c in doc["configs"])
    return [
        f"The tests behind the differences ({IMPLS[impl]}), with the first failing rank's reason:",
        "",
        f"| test | {configs} | reason | explanation |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
    ]


def render() -> str:
    lines: list[str] = []
    for impl in IMPLS:
        path = RESULTS / f"mpi4py-suite-{impl}.json"
        if not path.is_file():
            lines += [f"### {IMPLS[impl]}", "", f"Not run yet (`scripts/mpi4py-suite.sh --impl {impl}`).", ""]
            continue
        lines += impl_section(impl, json.loads(path.read_text()))
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
