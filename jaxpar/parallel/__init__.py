"""Registry: which Strategy runs a config. Adding a partitioning = one module + one entry.

Every strategy implements the protocol of strategy.py; nothing outside `parallel` needs to
know which one it has.
"""

from __future__ import annotations

from jaxpar import axes, models, run_spec
from jaxpar import config as config_lib
from jaxpar.parallel import schedules, stages, sync, tensor, variables
from jaxpar.parallel.data import DataParallel
from jaxpar.parallel.pipeline import Pipeline
from jaxpar.parallel.pmap import PmapDataParallel
from jaxpar.parallel.state import TrainState
from jaxpar.parallel.strategy import Program, Strategy
from jaxpar.parallel.tensor_parallel import TensorParallel
from jaxpar.run_spec import DEFAULTS

STRATEGIES: dict[str, type[Strategy]] = {
    "data": DataParallel,
    "pmap": PmapDataParallel,
    "tensor": TensorParallel,
    "pipeline": Pipeline,
}

__all__ = [
    "STRATEGIES",
    "Program",
    "Strategy",
    "TrainState",
    "build",
    "check_model",
    "choose",
    "resolve",
    "validate",
]


def choose(config, mesh_shape: dict[str, int]) -> str:
    """The strategy for a config on a mesh: config.strategy when it names one; with "auto", a
    pipeline when the mesh has stages, tensor parallelism when an axis is left to the sharding
    rules, else data parallelism over the batch axes (shard_map, or pmap with
    sync.impl=pmap)."""
    wanted = config.get("strategy", DEFAULTS.strategy)
    if wanted != "auto":
        return wanted
    if axes.num_stages(mesh_shape) > 1:
        return "pipeline"
    if axes.auto_axes(mesh_shape):
        return "tensor"
    return "pmap" if config.sync.impl == "pmap" else "data"


def validate(config, num_devices: int) -> dict[str, int]:
    """Every check of `config` before anything is built (`resolve`); the resolved mesh,
    {axis: size} in mesh order."""
    return resolve(config, num_devices).mesh.sizes


def resolve(config, num_devices: int) -> run_spec.RunSpec:
    """`config` checked on `num_devices` and resolved into the typed value the run reads.
    Every check fails in one line: the keys every run shares (config.validate), the
    partitioning's own keys (schedule, split, tensor rules, sync mode), then the chosen
    strategy's and sync rule's fit to the mesh."""
    shape = config_lib.validate(config, num_devices)
    config_lib.choice(config.get("strategy", DEFAULTS.strategy), ("auto", *STRATEGIES), "strategy")
    config_lib.choice(config.pipeline.schedule, schedules.NAMES, "pipeline.schedule")
    config_lib.check(
        config.pipeline.num_microbatches >= 0,
        "pipeline.num_microbatches must be >= 1, or 0 to have a training run choose it",
    )
    config_lib.check(config.pipeline.virtual_stages >= 1, "pipeline.virtual_stages must be >= 1")
    stages.parse(config.pipeline.split)  # a policy name or cut points; bounds checked at build
    tensor.check_rules(
        config.tensor.rules, tuple(shape), own_names=models.is_import_path(config.model.name)
    )
    config_lib.choice(config.sync.mode, tuple(sync.MODES), "sync.mode")
    name = choose(config, shape)
    strategy = STRATEGIES[name]
    for reason in (strategy.check(config, shape), sync.check(config, shape)):
        config_lib.check(reason is None, str(reason))
    accum = config.get("grad_accum_steps", DEFAULTS.grad_accum_steps)
    if accum != 1:
        per_device = config.global_batch_size // axes.num_replicas(shape)
        config_lib.check(
            isinstance(accum, int) and accum >= 1,
            f"grad_accum_steps must be a positive integer, got {accum!r}",
        )
        config_lib.check(
            strategy.accumulates,
            f"grad_accum_steps={accum} needs data or tensor parallelism, not "
            f"strategy={strategy.name}; a pipeline splits its batch with "
            "pipeline.num_microbatches",
        )
        config_lib.check(
            per_device % accum == 0,
            f"grad_accum_steps={accum} does not divide each device's batch of "
            f"{per_device}; use a divisor of {per_device}",
        )
    configured = tuple(int(n) for n in config.mesh_shape)
    mesh = run_spec.MeshSpec(tuple(shape), configured, shape, axes.num_replicas(shape))
    return run_spec.RunSpec.of_config(config, mesh, name)


def check_model(config, shape: dict[str, int], model) -> None:
    """The chosen strategy's and the mesh axes' refusals that need the model (channels that
    do not divide, too few layers to cut, maps too small to split), in one line, before
    anything is compiled."""
    reason = STRATEGIES[choose(config, shape)].check_model(config, shape, model)
    for name in axes.used(shape):
        reason = reason or axes.get(name).check(config, shape, model)
    reason = reason or variables.names_problem(model, tensor.rules_from(config), shape)
    config_lib.check(reason is None, str(reason))


def build(config, model, mesh, tx) -> Strategy:
    """The config's strategy on `mesh` (every refusal, the model's included, is one line
    before anything is built)."""
    check_model(config, dict(mesh.shape), model)
    return STRATEGIES[choose(config, dict(mesh.shape))](config, model, mesh, tx)
