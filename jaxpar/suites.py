"""Suite files (configs/bench/*.py, configs/predict/*.py: `base`, `overrides`, `rows`): load
one and build each row's full config, for the bench (no JAX here: the sweep process stays
light; every row runs in its own process) and for the predictor, with the rows' published or
measured references beside the predictions."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from typing import Any

import ml_collections

from jaxpar import configfile
from jaxpar.configfile import ROOT
from jaxpar.errors import ConfigError


def suite_path(name_or_path: str) -> str:
    """A suite by name (configs/bench/NAME.py) or by file path."""
    if os.path.exists(name_or_path):
        return os.path.abspath(name_or_path)
    path = os.path.join(ROOT, "configs", "bench", f"{name_or_path}.py")
    if not os.path.exists(path):
        raise SystemExit(f"error: no suite {name_or_path!r} (looked for {path})")
    return path


def load_suite(name_or_path: str) -> ml_collections.ConfigDict:
    return configfile.load(suite_path(name_or_path))


def row_config(
    suite: ml_collections.ConfigDict, row: dict, command_line: dict[str, Any]
) -> ml_collections.ConfigDict:
    """base <- suite overrides <- command line <- the row's own keys. A row whose mesh has no
    -1 uses the first prod(mesh) devices unless it says otherwise (config.num_devices)."""
    config = configfile.load(os.path.join(ROOT, suite.base))
    for layer in (dict(suite.overrides), command_line, row["config"]):
        configfile.override(config, layer)
    shape = tuple(config.mesh_shape)
    if "num_devices" not in row["config"] and -1 not in shape:
        config.num_devices = math.prod(shape)
    return config


def check_overrides(suite: ml_collections.ConfigDict, command_line: dict[str, Any]) -> None:
    """Fail in one line, before any row runs, on a command-line key the base config lacks."""
    config = configfile.load(os.path.join(ROOT, suite.base))
    for key, value in command_line.items():
        try:
            configfile.override(config, {key: value})
        except (KeyError, TypeError, ValueError) as e:
            raise SystemExit(f"error: --config.{key}={value!r}: {e}") from None


def plain(value: Any) -> Any:
    """`value` as it reads back from JSON (tuples become lists), for comparing with a file."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def suite_name(suite: str) -> str:
    return os.path.splitext(os.path.basename(suite))[0]


def suite_id(suite: str) -> str:
    """A suite file as the manifest names it: relative to the repository when inside it."""
    path = suite_path(suite)
    inside = os.path.commonpath([path, ROOT]) == ROOT
    return os.path.relpath(path, ROOT) if inside else path


def differences(theirs: dict, mine: dict) -> str:
    """`model.width=0.125 there, not given here; ...` for each key whose value differs."""

    def show(where: dict, key: str) -> str:
        return f"{key}={where[key]!r}" if key in where else "not given"

    keys = sorted(k for k in set(theirs) | set(mine) if theirs.get(k, ...) != mine.get(k, ...))
    return "; ".join(f"{show(theirs, k)} there, {show(mine, k)} here" for k in keys)


def fingerprint(config: ml_collections.ConfigDict) -> str:
    """Identifies a row's full config: a resumed sweep re-measures rows whose config changed."""
    return hashlib.sha1(config.to_json_best_effort(sort_keys=True).encode()).hexdigest()[:12]


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9=.-]+", "_", name).strip("_")


def _load(path: str):
    """A config or suite file's get_config(); a missing file is a ConfigError."""
    try:
        return configfile.load(path)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None


def _override(config, overrides: dict) -> None:
    """configfile.override, its refusals (unknown key, wrong type) as ConfigError."""
    try:
        configfile.override(config, overrides)
    except (KeyError, TypeError) as e:
        raise ConfigError(e.args[0]) from None


def load_rows(config_file: str | None, suite_file: str | None, overrides: dict) -> list[tuple]:
    """[(name, config, reference)] from one config file or a suite, with `overrides` on every
    row; a reference is a row's published images/sec, or {"efficiency": x} where only the
    efficiency is published, or None."""
    if suite_file:
        suite = _load(suite_file)
        base_file, common, rows = suite.base, dict(suite.overrides.items()), list(suite.rows)
    else:
        base_file, common, rows = config_file or "configs/base.py", {}, [{"name": "config"}]
    out = []
    for row in rows:
        config = _load(base_file)
        _override(config, {**common, **overrides, **dict(row.get("config", {}))})
        # a bench row's `reference` is the accuracy study's figure, not images/sec
        ref = None if "scaling" in row else row.get("reference")
        if ref is None and row.get("reference_efficiency") is not None:
            ref = {"efficiency": float(row["reference_efficiency"])}
        out.append((row["name"], config, ref))
    return out
