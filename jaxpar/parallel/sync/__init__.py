"""Registry of synchronisation modes (`sync.mode`): how data replicas agree.

Adding a mode is one module with a `SyncRule` subclass plus one entry here; config validation
reads the names and each rule's one-line refusals from this registry. Every mode runs on every
mesh: on a tensor axis each tensor shard's replicas follow the rule, on pipeline stages each
stage's replicas do (one rule per chunk of layers); a rule that cannot says why in
`refuses_tensor` / `refuses_stages`.
"""

from __future__ import annotations

import math

from jaxpar.parallel.replicas import Replicas
from jaxpar.parallel.sync.allreduce import AllReduce, average_gradients
from jaxpar.parallel.sync.async_sgd import Async
from jaxpar.parallel.sync.base import AXIS, SyncRule
from jaxpar.parallel.sync.local_sgd import Independent, LocalSGD
from jaxpar.parallel.sync.parameter_server import ParameterServer
from jaxpar.parallel.sync.sharded import Sharded

MODES: dict[str, type[SyncRule]] = {
    rule.name: rule for rule in (AllReduce, ParameterServer, Sharded, LocalSGD, Async, Independent)
}

__all__ = ["AXIS", "MODES", "SyncRule", "average_gradients", "build", "check"]


def check(config, data: int, stage: int, tensor: int) -> str | None:
    """Why `config`'s sync mode cannot run on this mesh (one line), or None."""
    rule = MODES[config.sync.mode]
    mode = f"sync.mode={rule.name}"
    if config.sync.impl not in rule.impls:
        return f"{mode} runs with sync.impl={'/'.join(rule.impls)}, not {config.sync.impl}"
    if tensor > 1 and rule.refuses_tensor:
        fix = _mesh_hint((data * stage * tensor, 1, 1), (data * tensor, 1, 1))
        return f"{mode} cannot combine with a tensor axis ({rule.refuses_tensor}); use {fix}"
    if stage > 1 and rule.refuses_stages:
        fix = _mesh_hint((data * stage, 1, tensor), (data, 1, tensor))
        return (f"{mode} cannot combine with pipeline stages ({rule.refuses_stages}); use "
                f"sync.mode=allreduce, or {fix}")  # fmt: skip
    return rule.check(config, data)


def _mesh_hint(every: tuple[int, ...], fewer: tuple[int, ...]) -> str:
    """Meshes that work: `every` on all the devices in use, else `fewer` on the first few."""
    hint = f"mesh_shape=({','.join(map(str, every))})"
    n = math.prod(fewer)
    if n < math.prod(every):
        hint += f", or mesh_shape=({','.join(map(str, fewer))}) with --config.num_devices={n}"
    return hint


def build(config, replicas: Replicas, tx, variable_specs: dict) -> SyncRule:
    """The config's rule for one model part with these variables' (tensor) specs."""
    return MODES[config.sync.mode](config, replicas, tx, variable_specs)
