"""Suite files (configs/bench/*.py, configs/predict/*.py: `base`, `overrides`, `rows`): load
one and build each row's full config, for the bench (no JAX here: the sweep process stays
light; every row runs in its own process) and for the predictor, with the rows' published or
measured references beside the predictions."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from typing import Any

import ml_collections

from jaxpar import configfile, run_spec
from jaxpar.configfile import ROOT
from jaxpar.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class SuiteRow:
    """One entry of a suite's `rows` (configs/bench's `row(...)` writes a bench suite's; a
    predictor suite's rows give a name, a config and a reference): its name, the overrides
    that make it (`config`, {dotted key: value}) and how it is read; the overrides the bench
    reads itself beside them."""

    name: str
    config: dict[str, Any]
    group: str = ""
    scaling: str | None = None
    baseline: str | None = None
    label: str | None = None
    reference: float | tuple[float, float] | None = None
    reference_efficiency: float | None = None
    seed: int | None = None  # the row's own seed, if it sets one
    mesh_shape: tuple | None = None  # the mesh the row asks for, if it names one
    mesh_axes: tuple | None = None
    global_batch_size: int | None = None
    sync_mode: str = run_spec.default("sync.mode")
    goodput_every_steps: int = run_spec.default("goodput.every_steps")  # its decision interval
    trains_to_target: bool = False  # the row sets a target accuracy or eval loss

    def as_record(self) -> dict[str, Any]:
        """The entry as configs/bench's `row(...)` makes it."""
        keys = ("name", "config", "group", "scaling", "baseline", "label", "reference")
        return {k: getattr(self, k) for k in keys} | {
            "reference_efficiency": self.reference_efficiency
        }

    @classmethod
    def of_record(cls, record: Any) -> SuiteRow:
        record = dict(record)
        config = dict(record.get("config", {}))
        shape, names = config.get("mesh_shape"), config.get("mesh_axes")
        return cls(
            name=record["name"],
            config=config,
            group=record.get("group", ""),
            scaling=record.get("scaling"),
            baseline=record.get("baseline"),
            label=record.get("label"),
            reference=record.get("reference"),
            reference_efficiency=record.get("reference_efficiency"),
            seed=config.get("seed"),
            mesh_shape=tuple(shape) if shape is not None else None,
            mesh_axes=tuple(names) if names else None,
            global_batch_size=config.get("global_batch_size"),
            sync_mode=run_spec.setting(config, "sync.mode"),
            goodput_every_steps=int(run_spec.setting(config, "goodput.every_steps")),
            trains_to_target=bool(config.get("target_accuracy") or config.get("target_eval_loss")),
        )


@dataclasses.dataclass(frozen=True)
class Reference:
    """A predicted row's reference: published or measured images/sec, or only a published
    scaling efficiency."""

    images_per_sec: float | None = None
    efficiency: float | None = None


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
    suite: ml_collections.ConfigDict, row: Any, command_line: dict[str, Any]
) -> ml_collections.ConfigDict:
    """base <- suite overrides <- command line <- the row's own keys (`row` as the suite file
    gives it). A row whose mesh has no -1 uses the first prod(mesh) devices unless it says
    otherwise (config.num_devices)."""
    entry = SuiteRow.of_record(row)
    config = configfile.load(os.path.join(ROOT, suite.base))
    for layer in (dict(suite.overrides), command_line, entry.config):
        configfile.override(config, layer)
    shape = tuple(config.mesh_shape)
    if "num_devices" not in entry.config and -1 not in shape:
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
    row; a reference is a row's published images/sec, or its published efficiency alone, or
    None."""
    if suite_file:
        suite = _load(suite_file)
        base_file, common = suite.base, dict(suite.overrides.items())
        rows = [SuiteRow.of_record(r) for r in suite.rows]
    else:
        base_file, common, rows = config_file or "configs/base.py", {}, [SuiteRow("config", {})]
    out = []
    for row in rows:
        config = _load(base_file)
        _override(config, {**common, **overrides, **row.config})
        # a bench row's `reference` is the accuracy study's figure, not images/sec
        ref = None if row.scaling is not None or row.reference is None else Reference(row.reference)
        if ref is None and row.reference_efficiency is not None:
            ref = Reference(efficiency=float(row.reference_efficiency))
        out.append((row.name, config, ref))
    return out
