"""dask-pmix's settings in dask.config: the yaml defaults, DASK_DASK_PMIX__... variables, the older
DASK_PMIX_* variables below them, and a schema that describes every key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dask.config
import yaml

import dask_pmix
from dask_pmix import config

PKG = Path(dask_pmix.__file__).resolve().parent


def in_fresh_process(code: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


READ = """
import json, dask_pmix
from dask_pmix import config
print(json.dumps({k: config.get(k) for k in ("sidecar.url", "sidecar.token", "sidecar.command", "job.impl")}
                 | {"wiring": config.seconds("timeouts.wiring"), "plugin_url": dask_pmix.SidecarPlugin().url}))
"""


def test_defaults_come_from_the_yaml():
    got = in_fresh_process(READ)
    assert got == {"sidecar.url": None, "sidecar.token": None, "sidecar.command": None, "job.impl": "openmpi",
                   "wiring": 60.0, "plugin_url": None}


def test_dask_environment_variables_set_them():
    got = in_fresh_process(READ, DASK_DASK_PMIX__SIDECAR__URL="http://127.0.0.1:9999",
                           DASK_DASK_PMIX__JOB__IMPL="mpich", DASK_DASK_PMIX__TIMEOUTS__WIRING="2 minutes")
    assert got["sidecar.url"] == got["plugin_url"] == "http://127.0.0.1:9999"
    assert (got["job.impl"], got["wiring"]) == ("mpich", 120.0)


def test_older_variables_still_work_below_the_dask_ones():
    got = in_fresh_process(READ, DASK_PMIX_URL="http://old:1", DASK_PMIX_TOKEN="t0k", DASK_PMIX_BIN="/opt/dask-pmix")
    assert (got["sidecar.url"], got["sidecar.token"], got["sidecar.command"]) == ("http://old:1", "t0k", "/opt/dask-pmix")
    got = in_fresh_process(READ, DASK_PMIX_URL="http://old:1", DASK_DASK_PMIX__SIDECAR__URL="http://new:2")
    assert got["sidecar.url"] == "http://new:2"


def test_dask_config_set_is_honoured():
    with dask.config.set({"dask-pmix.sidecar.url": "http://set:3", "dask-pmix.timeouts.request": "5s"}):
        assert config.get("sidecar.url") == "http://set:3"
        assert config.seconds("timeouts.request") == 5.0
        assert dask_pmix.SidecarPlugin().url == "http://set:3"


def test_the_schema_describes_every_key_and_nothing_else():
    defaults = yaml.safe_load((PKG / "dask-pmix.yaml").read_text())
    schema = yaml.safe_load((PKG / "dask-pmix-schema.yaml").read_text())

    def keys(d: dict, prefix: str = "") -> set[str]:
        out = set()
        for k, v in d.items():
            out |= keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
        return out

    def schema_keys(s: dict, prefix: str = "") -> set[str]:
        out = set()
        for k, v in s.get("properties", {}).items():
            out |= schema_keys(v, f"{prefix}{k}.") if v.get("type") == "object" else {prefix + k}
        return out

    assert keys(defaults) == schema_keys(schema)

    def leaves(s: dict):
        for v in s.get("properties", {}).values():
            yield from leaves(v) if v.get("type") == "object" else [v]

    assert all(leaf.get("description") for leaf in leaves(schema))


def test_given_sidecar_args_override_the_derived_ones_without_dropping_them():
    from dask_pmix.scheduler.serve_args import sidecar_argv

    with dask.config.set({"dask-pmix.pool.size": 64, "dask-pmix.pool.cohort": 1,
                          "dask-pmix.sidecar.args": ["--log-level", "debug"]}):
        derived = sidecar_argv([], "tcp://10.1.2.3:8786")
        given = sidecar_argv(["--pool-size", "8", "--log-level", "info"], "tcp://10.1.2.3:8786")
    # A scheduler on a routable address: the ranks reach the sidecar there.
    assert derived[:4] == ["--pmix-if", "10.1.2.3", "--pmi-host", "10.1.2.3"]
    assert derived[-2:] == ["--log-level", "debug"] and "--pool-cohort" in derived
    # Given arguments replace the configured extra ones and come last (serve takes an option's
    # last value), and the listeners, pool size and cohort stay.
    assert given[:len(derived) - 2] == derived[:-2]
    assert given[len(derived) - 2:] == ["--pool-size", "8", "--log-level", "info"]
