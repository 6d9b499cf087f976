"""Registry of synchronisation modes (`sync.mode`): how data-parallel replicas agree.

Adding a mode is one module with a `SyncRule` subclass plus one entry here; config validation
reads the names and each rule's one-line refusals from this registry.
"""

from __future__ import annotations

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
        return f"{mode} cannot combine with a tensor axis; use mesh_shape=({data * tensor},1,1)"
    if stage > 1 and not rule.allows_stages:
        return f"{mode} cannot combine with pipeline stages; use sync.mode=allreduce or stage 1"
    return rule.check(config, data)


def build(config, n: int, model, tx) -> SyncRule:
    return MODES[config.sync.mode](config, n, model, tx)
