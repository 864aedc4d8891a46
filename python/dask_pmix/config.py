"""dask-pmix's settings in dask.config, under `dask-pmix.` (dask-pmix.yaml holds the defaults,
dask-pmix-schema.yaml describes them). Set them in a Dask config file, with dask.config.set, or
as DASK_DASK_PMIX__SECTION__KEY environment variables. The older DASK_PMIX_URL, DASK_PMIX_TOKEN
and DASK_PMIX_BIN still work, below any of those."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dask.config
import yaml
from dask.utils import parse_timedelta

_HERE = Path(__file__).resolve().parent
defaults = yaml.safe_load((_HERE / "dask-pmix.yaml").read_text())
dask.config.update_defaults(defaults)

# The environment variables of earlier releases, and the settings they stand for.
LEGACY_ENV = {"DASK_PMIX_URL": "sidecar.url", "DASK_PMIX_TOKEN": "sidecar.token", "DASK_PMIX_BIN": "sidecar.command"}


def get(key: str, default: Any = None) -> Any:
    """The setting `dask-pmix.<key>`."""
    value = dask.config.get(f"dask-pmix.{key}", default=None)
    if value is None:
        for env, legacy_key in LEGACY_ENV.items():
            if legacy_key == key and os.environ.get(env):
                return os.environ[env]
    return default if value is None else value


def seconds(key: str) -> float | None:
    """A timeout setting in seconds (accepts "30s", "2 minutes", 30); None when unset."""
    value = get(key)
    return None if value is None else float(parse_timedelta(value, default="seconds"))
