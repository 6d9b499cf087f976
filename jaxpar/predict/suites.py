"""Prediction suites: the rows of a suite (or one config) with their published or measured
references, and those references beside the predictions (python -m jaxpar.predict and
--validate)."""

from __future__ import annotations

from jaxpar import configfile
from jaxpar.errors import ConfigError


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


def add_reference(rows: list[dict], references: list) -> None:
    """Beside each prediction, a suite's reference images/sec (published or measured) and its
    efficiency against the reference 1-device row of the same model; or a published efficiency
    alone ({"efficiency": x})."""
    bases = {}
    for r, ref in zip(rows, references):
        if isinstance(ref, int | float) and r.get("num_devices") == 1:
            bases.setdefault(r.get("model"), ref)
    for r, ref in zip(rows, references):
        if isinstance(ref, dict):
            r["reference_images_per_sec"], r["reference_efficiency"] = None, ref["efficiency"]
            continue
        base = ref if r.get("num_devices") == 1 else bases.get(r.get("model"))
        r["reference_images_per_sec"] = ref
        r["reference_efficiency"] = (
            ref / base / r["num_devices"] if ref and base and r.get("num_devices") else None
        )
