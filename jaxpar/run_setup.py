"""What a run is built from (`Setup`, built by `setup`: mesh, data, model, strategy, nothing
compiled yet; `Run`: one call of the trainer), the batches it feeds (`local_train_batch`) and
how it evaluates (`evaluate`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from jaxpar import axes, batch_schedule, compile_cache, configfile, models, optim, parallel, units
from jaxpar import config as config_lib
from jaxpar import data as data_lib
from jaxpar import mesh as mesh_lib
from jaxpar import watchdog as watchdog_lib
from jaxpar.errors import ConfigError
from jaxpar.parallel import adapt, stages
from jaxpar.parallel.pipeline import balance, microbatches
from jaxpar.parallel.state import add_sums
from jaxpar.run_spec import RunSpec

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Setup:
    """Everything a run is built from, before any step runs: the config (for the model, the
    data and the files written into the workdir) and what it resolves to (`spec`)."""

    config: ml_collections.ConfigDict
    spec: RunSpec
    mesh: Any
    dataset: data_lib.Dataset
    model: models.SequentialModel
    strategy: parallel.Strategy
    schedule: Any
    # (step, examples taken by then) where this setup's batch took over: the data position of
    # step s is examples + (s - step) x the batch (a run whose batch never changed: (0, 0))
    origin: tuple[int, int] = (0, 0)

    def examples_before(self, step: int) -> int:
        """The train examples the run has taken before step `step` + 1."""
        return self.origin[1] + (step - self.origin[0]) * self.spec.batches.global_size

    @property
    def data_size(self) -> int:
        """Data replicas: the product of the batch axes (data, node, fsdp, ...)."""
        return axes.num_replicas(dict(self.mesh.shape))


@dataclasses.dataclass(frozen=True)
class Run:
    """One call of `trainer.train_and_evaluate`: what it is built from and what it reports to (what
    it says goes to the "jaxpar" logger: jaxpar/log.py)."""

    setup: Setup
    workdir: str
    watch: watchdog_lib.Watchdog
    wall0: float  # when it started (perf_counter)
    profile: bool
    compiled: compile_cache.Counts  # the programs this process had built when it started


def setup(
    config: ml_collections.ConfigDict,
    devices: Sequence[jax.Device] | None = None,
    workdir: str | None = None,
) -> Setup:
    """Validate, then build mesh, data, model and strategy (nothing compiled yet).

    `config.num_devices` > 0 uses only the first N of the devices (like tf_cnn_benchmarks'
    --num_gpus): one line says so. A pipeline split by time (`pipeline.split="time"`) first
    times the model's layers on these devices (cached in `workdir`, pipeline/balance.py)."""
    devices = list(devices if devices is not None else jax.devices())
    wanted = config_lib.device_count(config, len(devices))
    if wanted < len(devices):
        logger.info(f"using the first {wanted} of {len(devices)} devices")
        devices = devices[:wanted]
    spec = parallel.resolve(config, len(devices))
    shape = spec.mesh.sizes
    mesh = mesh_lib.make_mesh(shape, devices)
    dataset = data_lib.load(config)
    data = dataset.spec
    model = models.build(config.model, data.image_shape, data.num_classes)
    parallel.check_model(config, shape, model)  # the refusals only the model tells
    if spec.pipeline.num_microbatches == 0:  # chosen by timing (pipeline/microbatches.py)
        config = config.copy_and_resolve_references()
        config.pipeline.num_microbatches = (
            microbatches.choose_microbatches(model, config, mesh, workdir)
            if axes.num_stages(shape) > 1
            else 1
        )
        spec = parallel.resolve(config, len(devices))
    if axes.num_stages(shape) > 1 and stages.parse(spec.pipeline.split) == "time":
        model = dataclasses.replace(model, times=balance.measure(model, config, mesh, workdir))
    batch_schedule.check(config)
    tx = optim.make_optimizer(spec.rate)
    strategy = parallel.build(config, model, mesh, tx)
    measured = strategy.noise_groups()
    if spec.rate.adaptation != "none" and isinstance(measured, str):
        raise ConfigError(adapt.refusal(spec.rate.adaptation, measured))
    return Setup(config, spec, mesh, dataset, model, strategy, optim.make_schedule(spec.rate))


def derive(setup: Setup, changes: dict[str, Any], origin: tuple[int, int]) -> Setup:
    """The same run on another batch, mesh or slicing (`changes`: config keys such as
    global_batch_size, mesh_shape, grad_accum_steps), taking over at `origin` (step, examples
    taken by then): the dataset and model are kept; the mesh, optimizer and strategy are
    built anew and checked as a new run's are (nothing compiled yet)."""
    config = configfile.override(setup.config.copy_and_resolve_references(), changes)
    devices = list(setup.mesh.devices.flat)
    spec = parallel.resolve(config, len(devices))
    shape = spec.mesh.sizes
    mesh = setup.mesh
    if tuple(shape.values()) != tuple(setup.mesh.devices.shape):
        mesh = mesh_lib.make_mesh(shape, sorted(devices, key=lambda d: d.id))
    parallel.check_model(config, shape, setup.model)
    strategy = parallel.build(config, setup.model, mesh, optim.make_optimizer(spec.rate))
    return dataclasses.replace(
        setup, config=config, spec=spec, mesh=mesh, strategy=strategy, origin=origin
    )


def local_train_batch(setup: Setup, step: int) -> dict[str, np.ndarray]:
    """This process's share of global batch `step` (deterministic in seed and step)."""
    share = setup.strategy.batch_share()
    return setup.dataset.train_batch(
        step,
        setup.spec.batches.global_size,
        *share,
        example_ids=setup.model.stochastic,
        offset=setup.examples_before(step),
    )


def evaluate(
    setup: Setup, state, watch: watchdog_lib.Watchdog | None = None, dataset=None
) -> dict[str, float]:
    """Loss and accuracy over the whole eval split (the padded last batch is masked) of
    `dataset` (the run's own by default)."""
    batch_size = setup.spec.batches.eval_size
    dataset = dataset or setup.dataset
    totals = None
    for i, local in enumerate(dataset.eval_batches(batch_size, *setup.strategy.batch_share())):
        # Every computation is counted in the strategy's dispatch window (dispatch.py).
        sums = setup.strategy.eval_step(state, setup.strategy.put_batch(local))
        totals = sums if totals is None else setup.strategy.inflight.add(add_sums(totals, sums))
        if watch is not None:
            watch.beat(f"evaluation batch {i + 1}")
    totals = jax.device_get(totals)
    count = max(float(totals["count"]), 1.0)
    out = {
        "loss": float(totals["loss_sum"]) / count,
        "accuracy": float(totals["correct"]) / count,
        "count": int(totals["count"]),  # images evaluated (padding excluded)
    }
    if "replica_correct" in totals:  # independent replicas: replica 0 above, and the spread
        per_replica = np.asarray(totals["replica_correct"]) / count
        out.update(accuracy_min=float(per_replica.min()), accuracy_max=float(per_replica.max()))
    return out


def announce(setup: Setup) -> None:
    """The run's opening lines: model, data, mesh and strategy, the model's layer table and
    the strategy's own description."""
    data, mesh, strategy = setup.dataset.spec, setup.mesh, setup.strategy
    logger.info(
        f"jaxpar: {setup.model.name} on {data.name} {data.image_shape}, "
        f"mesh {units.named_mesh(mesh.axis_names, mesh.devices.shape)} over "
        f"{mesh.devices.size} {jax.default_backend()} devices: {strategy.partitioning()}, "
        f"run by strategy {strategy.name}"
    )
    logger.info(setup.model.summary())
    if described := setup.strategy.describe(setup.spec.batches.global_size):
        logger.info(described)
