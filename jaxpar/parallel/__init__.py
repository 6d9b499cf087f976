"""Registry: which Strategy runs a config. Adding a partitioning = one module + one entry."""

from __future__ import annotations

from jaxpar.parallel.common import Strategy, TrainState
from jaxpar.parallel.data import DataParallel
from jaxpar.parallel.pmap import PmapDataParallel

STRATEGIES: dict[str, type[Strategy]] = {
    "shard_map": DataParallel,
    "pmap": PmapDataParallel,
}

__all__ = ["STRATEGIES", "Strategy", "TrainState", "build"]


def build(config, model, mesh, tx) -> Strategy:
    """Pick the strategy for `config` (today: data parallel via shard_map or pmap)."""
    return STRATEGIES[config.sync.impl](config, model, mesh, tx)
