"""Registry: which Strategy runs a config. Adding a partitioning = one module + one entry."""

from __future__ import annotations

from jaxpar.parallel.common import Strategy, TrainState
from jaxpar.parallel.data import DataParallel
from jaxpar.parallel.pipeline import Pipeline
from jaxpar.parallel.pmap import PmapDataParallel

STRATEGIES: dict[str, type[Strategy]] = {
    "shard_map": DataParallel,
    "pmap": PmapDataParallel,
    "pipeline": Pipeline,
}

__all__ = ["STRATEGIES", "Strategy", "TrainState", "build"]


def build(config, model, mesh, tx) -> Strategy:
    """Pick the strategy: a pipeline when the mesh has stages, else data parallelism."""
    name = "pipeline" if mesh.shape["stage"] > 1 else config.sync.impl
    return STRATEGIES[name](config, model, mesh, tx)
