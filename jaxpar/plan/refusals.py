"""Why the trainer refuses a candidate (`check`: its one line, from the config, the mesh and
the model, nothing compiled), and the commonest reasons over many (`commonest`)."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from typing import Any

import ml_collections

from jaxpar import models, oneline, parallel
from jaxpar.predict.programs.workload import input_spec


def check(config: ml_collections.ConfigDict, candidate) -> str | None:
    """Why the trainer refuses `candidate` for `config` (its one line), or None: every
    refusal of the config and the mesh, and those only the model tells (channels that do not
    divide, too few layers to cut); nothing is compiled."""
    try:
        applied = candidate.apply(config)
        shape = parallel.validate(applied, candidate.num_devices)
        parallel.check_model(applied, shape, _model(config))
    except (ValueError, KeyError, TypeError) as e:  # ConfigError is a ValueError
        return oneline.first_line(e)
    return None


_MODELS: dict = {}


def _model(config: ml_collections.ConfigDict):
    """The config's model (built once per model config: layers and shapes, nothing run)."""
    spec = input_spec(config)
    key = (config.model.to_json(), repr(spec))
    if key not in _MODELS:
        _MODELS[key] = models.build(config.model, *spec)
    return _MODELS[key]


def commonest(refused: Iterable[tuple[Any, str]], top: int = 3) -> list[tuple[str, int]]:
    """The commonest refusal reasons with their counts: reasons that differ only in their
    numbers count as one (shown as its first instance)."""
    first: dict[str, str] = {}
    counts: collections.Counter = collections.Counter()
    for _, reason in refused:
        key = re.sub(r"\d+", "N", reason)
        first.setdefault(key, reason)
        counts[key] += 1
    return [(first[k], n) for k, n in counts.most_common(top)]
