#!/usr/bin/env python3
"""Prints a deb822 apt source for another Debian suite on the mirror this system already uses.

    scripts/apt-suite-source.py trixie > private.sources

The project names no package host: the mirror (and its Signed-By) comes from the system's own
sources, /etc/apt/sources.list and sources.list.d (one-line `.list` and deb822 `.sources`), from
the entry that serves this release's own suite (not -updates or -security); only the suite is
swapped. APT_ETC and OS_RELEASE override where they are read (for the tests).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def codename(os_release: Path) -> str:
    for line in os_release.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "VERSION_CODENAME":
            return value.strip().strip('"')
    raise SystemExit(f"no VERSION_CODENAME in {os_release}")


def one_line_entries(text: str):
    """`deb [opt=val ...] uri suite component...` lines."""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if words[0] != "deb":
            continue
        options: dict[str, str] = {}
        rest = words[1:]
        if rest and rest[0].startswith("["):
            opts = []
            while rest:
                word = rest.pop(0)
                opts.append(word)
                if word.endswith("]"):
                    break
            for opt in " ".join(opts).strip("[]").split():
                key, _, value = opt.partition("=")
                options[key.lower()] = value
        if len(rest) < 2:
            continue
        yield {"uris": [rest[0]], "suites": [rest[1]], "signed-by": options.get("signed-by", "")}


def deb822_entries(text: str):
    """Stanzas of `Field: value` lines (continuation lines start with a space); `#` comments."""
    stanzas: list[dict[str, str]] = [{}]
    key = None
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if stanzas[-1]:
                stanzas.append({})
            key = None
            continue
        if raw[0] in " \t" and key:
            stanzas[-1][key] += "\n" + raw
            continue
        key, _, value = raw.partition(":")
        key = key.strip().lower()
        stanzas[-1][key] = value.strip()
    for s in stanzas:
        if not s or "deb" not in s.get("types", "").split():
            continue
        if s.get("enabled", "yes").strip().lower() == "no":
            continue
        yield {"uris": s.get("uris", "").split(), "suites": s.get("suites", "").split(),
               "signed-by": s.get("signed-by", "")}


def system_entries(etc: Path):
    files = [etc / "sources.list"] + sorted((etc / "sources.list.d").glob("*.list"))
    for f in files:
        if f.is_file():
            yield from one_line_entries(f.read_text())
    for f in sorted((etc / "sources.list.d").glob("*.sources")):
        yield from deb822_entries(f.read_text())


def source_for(suite: str, etc: Path, os_release: Path) -> str:
    mine = codename(os_release)
    for entry in system_entries(etc):
        if mine in entry["suites"] and entry["uris"]:
            lines = ["Types: deb", f"URIs: {entry['uris'][0]}", f"Suites: {suite}", "Components: main",
                     f"Signed-By: {entry['signed-by'] or '/usr/share/keyrings/debian-archive-keyring.gpg'}"]
            return "\n".join(lines) + "\n"
    raise SystemExit(f"no apt source for '{mine}' in {etc}/sources.list or {etc}/sources.list.d: "
                     "add the Debian mirror this machine uses, then rerun")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: apt-suite-source.py SUITE")
    sys.stdout.write(source_for(sys.argv[1], Path(os.environ.get("APT_ETC", "/etc/apt")),
                                Path(os.environ.get("OS_RELEASE", "/etc/os-release"))))
