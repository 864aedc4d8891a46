"""scripts/apt-suite-source.py: the private apt source for the PMIx headers takes its mirror from
the system's own sources, in both formats, and swaps only the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "apt-suite-source.py"


def run(tmp_path: Path, files: dict[str, str], codename: str = "bookworm") -> subprocess.CompletedProcess:
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (etc / name).write_text(text)
    (tmp_path / "os-release").write_text(f'NAME="Debian"\nVERSION_CODENAME={codename}\n')
    env = {**os.environ, "APT_ETC": str(etc), "OS_RELEASE": str(tmp_path / "os-release")}
    return subprocess.run([sys.executable, str(SCRIPT), "trixie"], env=env, capture_output=True, text=True, timeout=30)


def fields(out: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.strip().splitlines())


def test_deb822_takes_the_release_entry_not_security_or_disabled(tmp_path):
    out = run(tmp_path, {"sources.list.d/debian.sources": """\
Types: deb
URIs: http://mirror.example.org/security
Suites: bookworm-security
Components: main

# a comment
Types: deb
URIs: http://disabled.example.org/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb deb-src
URIs: http://mirror.example.org/debian
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /etc/keys/mirror.gpg
""", "sources.list.d/other.list.disabled": "deb http://wrong.example.org/debian bookworm main\n"})
    assert out.returncode == 0, out.stderr
    assert fields(out.stdout) == {"Types": "deb", "URIs": "http://mirror.example.org/debian", "Suites": "trixie",
                                  "Components": "main", "Signed-By": "/etc/keys/mirror.gpg"}


def test_one_line_format_with_options(tmp_path):
    out = run(tmp_path, {"sources.list": """\
# deb http://commented.example.org/debian bookworm main
deb-src http://src.example.org/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] https://local.example.net/debian/ bookworm main non-free
deb http://local.example.net/debian-security bookworm-security main
"""})
    assert out.returncode == 0, out.stderr
    f = fields(out.stdout)
    assert (f["URIs"], f["Suites"], f["Signed-By"]) == ("https://local.example.net/debian/", "trixie", "/usr/share/keyrings/k.gpg")


def test_no_usable_source_says_what_to_do(tmp_path):
    out = run(tmp_path, {"sources.list": "deb http://x.example.org/debian bullseye main\n"})
    assert out.returncode != 0
    assert "no apt source for 'bookworm'" in out.stderr and "add the Debian mirror" in out.stderr


@pytest.mark.parametrize("path", ["scripts", "bin", "python/dask_pmix", "src", "native", "package.json"])
def test_no_package_host_is_named_in_setup_or_runtime(path):
    # The project's own files only: build output (the dashboard page inlines Chart.js, whose
    # licence comments name its authors' repositories) is not something the project wrote, and
    # reaches no host (the page is served whole by the sidecar and the scheduler).
    root = SCRIPT.parents[1]
    found = subprocess.run(["git", "-C", str(root), "grep", "-lEI",
                            r"https?://[a-z0-9.-]*(debian|ubuntu|pypi|npmjs|nodesource|github)\.", "--", path],
                           capture_output=True, text=True)
    assert found.returncode in (0, 1), found.stderr
    assert found.stdout == "", found.stdout
