"""The configuration reference (a Markdown table) from python/dask_pmix/dask-pmix.yaml, its
defaults and its comments, so that the docs and the defaults cannot drift apart."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "python" / "dask_pmix" / "dask-pmix.yaml"


def rows(text: str) -> list[tuple[str, str, str]]:
    """(dotted key, default, comment) for every leaf of the file, in the file's order."""
    defaults = yaml.safe_load(text)["dask-pmix"]
    out: list[list[str]] = []
    path: list[tuple[int, str]] = []
    for line in text.splitlines()[1:]:
        m = re.match(r"^( *)([A-Za-z0-9_-]+):(.*)$", line)
        if m:
            indent, key, rest = len(m[1]), m[2], m[3]
            path = [p for p in path if p[0] < indent] + [(indent, key)]
            comment = rest.partition("#")[2]
            keys = [k for _, k in path]
            node = defaults
            for k in keys:
                node = node[k]
            if not isinstance(node, dict):
                out.append([".".join(keys), _show(node), comment.strip()])
            continue
        stripped = line.strip()
        if stripped.startswith("#") and out:
            out[-1][2] += " " + stripped.lstrip("#").strip()
    return [tuple(r) for r in out]  # type: ignore[misc]


def _show(value: object) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return str(value).lower()
    if value == []:
        return "[]"
    return str(value)


def table(text: str) -> str:
    lines = ["| key (under `dask-pmix`) | default | what |", "| --- | --- | --- |"]
    for key, default, comment in rows(text):
        lines.append(f"| `{key}` | `{default}` | {comment.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table(SOURCE.read_text()))
