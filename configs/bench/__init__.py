"""Benchmark suites for `python -m jaxpar.bench --suite NAME`.

A suite is a config file whose `get_config()` returns a ConfigDict with
  base:      the experiment config file every row starts from (path from the repository root);
  overrides: {dotted key: value} applied to every row (the suite's common model, batch, steps);
  rows:      a tuple of `row(...)` dicts: a name, the overrides that make the row, and how the
             row is read (plot group, strong or weak scaling, which row is its baseline).
Command-line `--config.KEY=VALUE` applies to every row after the suite's overrides; a row's own
keys win, so a row always is what its name says. Adding a study = writing one file here.
"""

from __future__ import annotations

import math
from typing import Any

import ml_collections


def suite(base: str, overrides: dict[str, Any], rows=()) -> ml_collections.ConfigDict:
    """A suite: `base` (path from the repository root), `overrides` ({dotted key: value} for
    every row) and `rows`. configs/predict/*.py use this format too."""
    out = ml_collections.ConfigDict()
    out.base = base
    out.overrides = ml_collections.ConfigDict(allow_dotted_keys=True)  # "model.width": ...
    out.overrides.update(overrides)
    out.rows = tuple(rows)
    return out


def row(
    name: str,
    overrides: dict[str, Any],
    group: str = "",
    scaling: str = "strong",
    baseline: str = "",
    label: str = "",
    reference: float | tuple[float, float] | None = None,
    reference_efficiency: float | None = None,
) -> dict[str, Any]:
    """One row of a suite.

    group: the line (scaling plots) or family (other plots) the row belongs to; "" = none.
    scaling: "strong" (same global batch as the baseline), "weak" (same batch per device), or
    "none" (no speedup: a study of something else, such as accuracy against batch size).
    baseline: the row speedup is measured against; "" = the suite's 1-device row of the same
    scaling kind.
    label: rows with the same label are one setting under different seeds (the accuracy study
    folds them into one line with their spread); "" = the row's name.
    reference: the published figure for this setting (one value or a (low, high) range), shown
    beside jaxpar's in the accuracy study.
    reference_efficiency: the published scaling efficiency for this setting, shown beside the
    row's prediction (python -m jaxpar.bench --predict PROFILE, or the suite's
    `predict_profile`).
    """
    return {
        "name": name,
        "config": dict(overrides),
        "group": group,
        "scaling": scaling,
        "baseline": baseline,
        "label": label,
        "reference": reference,
        "reference_efficiency": reference_efficiency,
    }


def devices(mesh_shape: tuple[int, int, int]) -> int:
    return math.prod(mesh_shape)
