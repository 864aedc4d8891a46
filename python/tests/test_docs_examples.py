"""Every Python example in the README and the docs is a complete program, and runs: each
```python block of README.md and docs/**/*.md is run as a script against a real cluster (the
examples start their own LocalCluster with the plugin) and must exit 0; the examples assert
their own results. Identical blocks run once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import IMPL

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(IMPL != "openmpi", reason="the examples use the default MPI library, Open MPI")


def examples() -> dict[str, str]:
    """{first place it appears: code} for every distinct ```python block."""
    files = [ROOT / "README.md"] + sorted(
        p for p in (ROOT / "docs").rglob("*.md") if not {"_build", "_generated"} & set(p.parts)
    )
    found: dict[str, str] = {}
    for path in files:
        text = path.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            code = m.group(1)
            if code not in found.values():
                line = text[: m.start()].count("\n") + 1
                found[f"{path.relative_to(ROOT)}:{line}"] = code
    return found


EXAMPLES = examples()


def test_there_are_examples():
    assert len(EXAMPLES) >= 4, list(EXAMPLES)


@pytest.mark.parametrize("where", sorted(EXAMPLES))
def test_example_runs(where, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(EXAMPLES[where])
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert proc.returncode == 0, f"{where} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
