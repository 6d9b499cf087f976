"""A run resolved once: the typed value (`RunSpec`) that a validated config becomes, and the
defaults every key falls back on.

`jaxpar.parallel.resolve(config, num_devices)` validates a ConfigDict (one-line errors) and
builds its RunSpec with `RunSpec.of_config`; the loop, the optimiser, the summary and the
target code then read the typed pieces (`spec.batches.global_size`, `spec.rate`,
`spec.sync.period`) instead of the ConfigDict. A key a config lacks takes configs/base.py's
value (`default`, `setting`): the defaults are written there once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from configs import base  # the repository's defaults: configs/ sits beside jaxpar/

DEFAULTS = base.get_config()
# The config key each approximate sync mode's steps factor is keyed by (target/sync_factors.py).
SYNC_SETTING_KEYS = {"local_sgd": "sync.period", "async": "sync.max_staleness"}
ADAPTATIONS = ("none", "adascale")  # lr_adaptation: how the rate follows the measured noise


def default(key: str) -> Any:
    """configs/base.py's value of a dotted key ("sync.period")."""
    node = DEFAULTS
    for part in key.split("."):
        node = node[part]
    return node


def setting(config: Any, key: str) -> Any:
    """A dotted key's value in a ConfigDict (or a {dotted key: value} mapping of overrides),
    configs/base.py's value where it lacks the key."""
    if isinstance(config, Mapping) and key in config:
        return config[key]
    node = config
    for part in key.split("."):
        if node is None or part not in node:
            return default(key)
        node = node[part]
    return node


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """The mesh's named axes, their sizes as configured (one may be -1) and as resolved, and
    its data replicas (the product of the batch axes: data, node, fsdp, ...)."""

    axes: tuple[str, ...]
    shape: tuple[int, ...]
    sizes: dict[str, int]
    replicas: int

    @property
    def num_devices(self) -> int:
        return math.prod(self.sizes.values())


@dataclasses.dataclass(frozen=True)
class Batches:
    """Images a step trains on (over all devices), a replica's share, the slices it is run
    as (gradient accumulation), and the evaluation batch."""

    global_size: int
    eval_size: int
    replicas: int
    grad_accum_steps: int

    @property
    def per_replica(self) -> int:
        return self.global_size // self.replicas


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    schedule: str
    num_microbatches: int  # 0: chosen by timing (run_setup)
    remat: bool
    virtual_stages: int
    split: Any  # a policy name or the layer indices where stages begin


@dataclasses.dataclass(frozen=True)
class SyncSpec:
    """How data-parallel replicas agree (sync.mode) and each mode's settings."""

    mode: str
    server: int
    period: int
    opt_state_at_average: str
    max_staleness: int
    staleness_aware_lr: bool
    impl: str
    batch_norm: str
    bucket_bytes: int

    @classmethod
    def of_config(cls, config: Any) -> SyncSpec:
        """The sync settings of a ConfigDict (a key it lacks takes base.py's value)."""
        return cls(*(setting(config, f"sync.{f.name}") for f in dataclasses.fields(cls)))

    @property
    def setting(self) -> int:
        """The setting an approximate mode's step factor is keyed by (local SGD's period,
        async's largest staleness); 0 for the exact modes."""
        key = SYNC_SETTING_KEYS.get(self.mode)
        return 0 if key is None else int(getattr(self, key.removeprefix("sync.")))


@dataclasses.dataclass(frozen=True)
class RateRule:
    """The optimiser and its learning rate: the peak rate for `base_batch` images, the rule
    that scales it to `batch`, the schedule over `schedule_steps` (0: `train_steps`) and the
    adaptation to the measured noise (jaxpar/optim.py builds them)."""

    optimizer: str
    momentum: float
    nesterov: bool
    trust_coefficient: float
    weight_decay: float
    learning_rate: float
    schedule: str
    warmup_steps: int
    schedule_steps: int
    train_steps: int
    base_batch: int
    batch: int
    linear_scaling: bool
    noise_scale: float
    adaptation: str
    noise_scale_decay: float

    @classmethod
    def of_config(cls, config: Any) -> RateRule:
        """The rule of a ConfigDict (validated or not: a key it lacks takes base.py's value)."""
        s = lambda key: setting(config, key)
        return cls(
            optimizer=s("optimizer.name"),
            momentum=s("optimizer.momentum"),
            nesterov=s("optimizer.nesterov"),
            trust_coefficient=s("optimizer.trust_coefficient"),
            weight_decay=float(s("weight_decay")),
            learning_rate=float(s("learning_rate")),
            schedule=s("lr_schedule"),
            warmup_steps=int(s("warmup_steps")),
            schedule_steps=int(s("schedule_steps")),
            train_steps=int(s("num_train_steps")),
            base_batch=int(s("lr_base_batch_size")),
            batch=int(s("global_batch_size")),
            linear_scaling=bool(s("lr_linear_scaling")),
            noise_scale=float(s("lr_noise_scale")),
            adaptation=s("lr_adaptation"),
            noise_scale_decay=float(s("noise_scale_decay")),
        )


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """What the run aims at (0: no aim on that figure) and whether it ends there."""

    accuracy: float
    eval_loss: float
    stop_at_target: bool

    @property
    def wanted(self) -> bool:
        return self.accuracy > 0 or self.eval_loss > 0


@dataclasses.dataclass(frozen=True)
class Measure:
    """What the run measures and how often: the noise scale, logs, evaluations."""

    noise_scale: bool
    noise_scale_decay: float
    log_every_steps: int
    eval_every_steps: int  # 0: only at the end
    eval_train_examples: int  # 0: none


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A validated config, resolved: what the loop, the strategies and the summary read."""

    mesh: MeshSpec
    strategy: str  # the partitioning that runs it (parallel.STRATEGIES)
    batches: Batches
    pipeline: PipelineSpec
    sync: SyncSpec
    rate: RateRule
    target: TargetSpec
    measure: Measure
    train_steps: int  # steps, or the progress to reach with an adapting rate
    seed: int
    checkpoint_every_steps: int  # 0: none
    checkpoint_max_to_keep: int
    hang_timeout_s: float
    stop_grace_s: float
    goodput_schedule: bool  # batch_schedule or mesh_schedule is "goodput"

    @classmethod
    def of_config(cls, config: Any, mesh: MeshSpec, strategy: str) -> RunSpec:
        """The spec of a config already validated on `mesh`, run by `strategy`."""
        s = lambda key: setting(config, key)
        global_size = int(s("global_batch_size"))
        return cls(
            mesh=mesh,
            strategy=strategy,
            batches=Batches(
                global_size,
                int(s("eval_batch_size") or global_size),
                mesh.replicas,
                int(s("grad_accum_steps")),
            ),
            pipeline=PipelineSpec(
                s("pipeline.schedule"),
                int(s("pipeline.num_microbatches")),
                bool(s("pipeline.remat")),
                int(s("pipeline.virtual_stages")),
                s("pipeline.split"),
            ),
            sync=SyncSpec.of_config(config),
            rate=RateRule.of_config(config),
            target=TargetSpec(
                float(s("target_accuracy")),
                float(s("target_eval_loss")),
                bool(s("stop_at_target")),
            ),
            measure=Measure(
                bool(s("measure_noise_scale")),
                float(s("noise_scale_decay")),
                int(s("log_every_steps")),
                int(s("eval_every_steps")),
                int(s("eval_train_examples")),
            ),
            train_steps=int(s("num_train_steps")),
            seed=int(s("seed")),
            checkpoint_every_steps=int(s("checkpoint_every_steps")),
            checkpoint_max_to_keep=int(s("checkpoint.max_to_keep")),
            hang_timeout_s=s("hang_timeout_s"),
            stop_grace_s=s("stop_grace_s"),
            goodput_schedule="goodput" in (s("batch_schedule"), s("mesh_schedule")),
        )
