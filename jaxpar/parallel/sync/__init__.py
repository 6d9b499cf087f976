"""Registry of synchronisation modes (`sync.mode`): how data-parallel replicas agree.

Adding a mode is one module with a `SyncRule` subclass plus one entry here; config validation
reads the names and each rule's one-line refusals from this registry.
"""

from __future__ import annotations

import math

from jaxpar.parallel.sync.allreduce import AllReduce, average_gradients, replica_step
from jaxpar.parallel.sync.async_sgd import Async
from jaxpar.parallel.sync.base import AXIS, SyncRule
from jaxpar.parallel.sync.local_sgd import Independent, LocalSGD
from jaxpar.parallel.sync.parameter_server import ParameterServer
from jaxpar.parallel.sync.sharded import Sharded

MODES: dict[str, type[SyncRule]] = {
    rule.name: rule for rule in (AllReduce, ParameterServer, Sharded, LocalSGD, Async, Independent)
}

__all__ = ["AXIS", "MODES", "SyncRule", "average_gradients", "build", "check", "replica_step"]


def check(config, data: int, stage: int, tensor: int) -> str | None:
    """Why `config`'s sync mode cannot run on this mesh (one line), or None."""
    rule = MODES[config.sync.mode]
    mode = f"sync.mode={rule.name}"
    if config.sync.impl not in rule.impls:
        return f"{mode} runs with sync.impl={'/'.join(rule.impls)}, not {config.sync.impl}"
    if tensor > 1 and not rule.allows_tensor:
        fix = _mesh_hint((data * stage * tensor, 1, 1), (data * tensor, 1, 1))
        return f"{mode} cannot combine with a tensor axis; use {fix}"
    if stage > 1 and not rule.allows_stages:
        fix = _mesh_hint((data * stage, 1, tensor), (data, 1, tensor))
        return f"{mode} cannot combine with pipeline stages; use sync.mode=allreduce, or {fix}"
    return rule.check(config, data)


def _mesh_hint(every: tuple[int, ...], fewer: tuple[int, ...]) -> str:
    """Meshes that work: `every` on all the devices in use, else `fewer` on the first few."""
    hint = f"mesh_shape=({','.join(map(str, every))})"
    n = math.prod(fewer)
    if n < math.prod(every):
        hint += f", or mesh_shape=({','.join(map(str, fewer))}) with --config.num_devices={n}"
    return hint


def build(config, n: int, model, tx) -> SyncRule:
    return MODES[config.sync.mode](config, n, model, tx)
