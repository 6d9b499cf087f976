"""Load a suite file and build each row's full config (no JAX here: the sweep process stays
light; every row runs in its own process)."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import math
import os
import re
import sys
from typing import Any

import ml_collections

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # `from configs.bench import row` inside suite files
    sys.path.insert(0, ROOT)


def _load(path: str):
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def suite_path(name_or_path: str) -> str:
    """A suite by name (configs/bench/NAME.py) or by file path."""
    if os.path.exists(name_or_path):
        return os.path.abspath(name_or_path)
    path = os.path.join(ROOT, "configs", "bench", f"{name_or_path}.py")
    if not os.path.exists(path):
        raise SystemExit(f"error: no suite {name_or_path!r} (looked for {path})")
    return path


def load_suite(name_or_path: str) -> ml_collections.ConfigDict:
    return _load(suite_path(name_or_path)).get_config()


def parse_value(text: str) -> Any:
    """A command-line value: a Python literal (1, 0.5, True, (2,1,4)) or else a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_overrides(args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Split `--config.KEY=VALUE` arguments from the rest."""
    overrides, rest = {}, []
    for arg in args:
        match = re.fullmatch(r"--config\.([\w.]+)=(.*)", arg, re.DOTALL)
        if match:
            overrides[match.group(1)] = parse_value(match.group(2))
        else:
            rest.append(arg)
    return overrides, rest


def set_key(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    """Set dotted `key` ("model.width") as --config.model.width=VALUE would."""
    node = config
    *path, leaf = key.split(".")
    for part in path:
        node = node[part]
    if leaf not in node:  # the base config is unlocked: refuse a misspelt key, do not add it
        raise KeyError(f"unknown config key {key!r}")
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(value, int) and isinstance(node.get(leaf), float):
        value = float(value)
    node[leaf] = value


def row_config(
    suite: ml_collections.ConfigDict, row: dict, command_line: dict[str, Any]
) -> ml_collections.ConfigDict:
    """base <- suite overrides <- command line <- the row's own keys. A row whose mesh has no
    -1 uses the first prod(mesh) devices unless it says otherwise (config.num_devices)."""
    config = _load(os.path.join(ROOT, suite.base)).get_config()
    for layer in (dict(suite.overrides), command_line, row["config"]):
        for key, value in layer.items():
            set_key(config, key, value)
    shape = tuple(config.mesh_shape)
    if "num_devices" not in row["config"] and -1 not in shape:
        config.num_devices = math.prod(shape)
    return config


def check_overrides(suite: ml_collections.ConfigDict, command_line: dict[str, Any]) -> None:
    """Fail in one line, before any row runs, on a command-line key the base config lacks."""
    config = _load(os.path.join(ROOT, suite.base)).get_config()
    for key, value in command_line.items():
        try:
            set_key(config, key, value)
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
