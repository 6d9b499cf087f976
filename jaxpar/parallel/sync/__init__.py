"""Registry of synchronisation modes (`sync.mode`): how data replicas agree.

Adding a mode is one module with a `SyncRule` subclass plus one entry here; config validation
reads the names and each rule's one-line refusals from this registry. Every mode runs on every
mesh: on a tensor axis each tensor shard's replicas follow the rule, on pipeline stages each
stage's replicas do (one rule per chunk of layers); a rule that cannot says why in
`refuses_tensor` / `refuses_stages`.
"""

from __future__ import annotations

import math

from jaxpar import axes, run_spec
from jaxpar import mesh as mesh_lib
from jaxpar.parallel.replicas import Replicas
from jaxpar.parallel.sync.allreduce import AllReduce, average_gradients
from jaxpar.parallel.sync.async_sgd import Async
from jaxpar.parallel.sync.base import SyncRule
from jaxpar.parallel.sync.local_sgd import Independent, LocalSGD
from jaxpar.parallel.sync.parameter_server import ParameterServer
from jaxpar.parallel.sync.sharded import Sharded
from jaxpar.run_spec import SyncSpec

MODES: dict[str, type[SyncRule]] = {
    rule.name: rule for rule in (AllReduce, ParameterServer, Sharded, LocalSGD, Async, Independent)
}

__all__ = ["MODES", "SyncRule", "average_gradients", "build", "check"]


def check(config, shape: dict[str, int]) -> str | None:
    """Why `config`'s sync mode cannot run on this mesh ({axis: size}; one line), or None."""
    rule = MODES[config.sync.mode]
    mode = f"sync.mode={rule.name}"
    bucket = run_spec.setting(config, "sync.bucket_bytes")
    if not isinstance(bucket, int) or isinstance(bucket, bool) or bucket < 0:
        return f"sync.bucket_bytes must be a whole number of bytes >= 0 (0: no buckets), got {bucket!r}"
    if config.sync.impl not in rule.impls:
        return f"{mode} runs with sync.impl={'/'.join(rule.impls)}, not {config.sync.impl}"
    ruled = axes.auto_axes(shape)
    if ruled and rule.refuses_tensor:
        fix = _mesh_hint(shape, ruled)
        return (
            f"{mode} cannot combine with the {'/'.join(ruled)} axis "
            f"({rule.refuses_tensor}); use {fix}"
        )
    if axes.num_stages(shape) > 1 and rule.refuses_stages:
        fix = _mesh_hint(shape, (axes.stage_axis(shape),))
        return (
            f"{mode} cannot combine with pipeline stages ({rule.refuses_stages}); use "
            f"sync.mode=allreduce, or {fix}"
        )
    return rule.check(config, axes.num_replicas(shape))


def _mesh_hint(shape: dict[str, int], drop: tuple[str, ...]) -> str:
    """Meshes that work without the `drop` axes: their devices moved to the first batch axis,
    else those axes set to 1 on the first few devices."""
    names = tuple(shape)
    first = axes.batch_axes(shape)[0] if axes.batch_axes(shape) else names[0]
    moved = math.prod(shape[a] for a in drop)
    every = [shape[a] * moved if a == first else 1 if a in drop else shape[a] for a in names]
    fewer = [1 if a in drop else shape[a] for a in names]
    hint = f"--config.mesh_shape={mesh_lib.spelled_shape(names, every)}"
    n = math.prod(fewer)
    if n < math.prod(every):
        hint += (
            f", or --config.mesh_shape={mesh_lib.spelled_shape(names, fewer)} "
            f"--config.num_devices={n}"
        )
    return hint


def build(settings: SyncSpec, replicas: Replicas, tx, variable_specs: dict) -> SyncRule:
    """The rule of `settings.mode` for one model part with these variables' (tensor) specs."""
    return MODES[settings.mode](settings, replicas, tx, variable_specs)
