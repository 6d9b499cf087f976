"""Validate a ConfigDict before anything compiles: one-line errors that say how to fix them."""

from __future__ import annotations

import math
import os
import re

import ml_collections

from jaxpar import models
from jaxpar.errors import ConfigError
from jaxpar.mesh import AXES, resolve_shape
from jaxpar.models.layers import LOGICAL_AXES
from jaxpar.parallel import stages

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1")
OPTIMIZERS = ("sgd", "adam")
LR_SCHEDULES = ("cosine", "constant")
SYNC_IMPLS = ("shard_map", "pmap")
BN_SYNC = ("global", "local")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _choice(value, allowed, key: str) -> None:
    _check(value in allowed, f"unknown {key} {value!r}; choose one of {', '.join(allowed)}")


def device_count(config: ml_collections.ConfigDict, present: int) -> int:
    """How many of the `present` devices the run uses: config.num_devices, or all (0)."""
    wanted = config.get("num_devices", 0)
    _check(
        isinstance(wanted, int) and 0 <= wanted <= present,
        f"num_devices {wanted!r} must be between 0 (all) and the {present} devices present",
    )
    return wanted or present


def validate(config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
    """Check `config` against `num_devices`; return the resolved (data, stage, tensor) shape."""
    shape = tuple(config.mesh_shape)
    _check(
        len(shape) == len(AXES) and all(isinstance(s, int) for s in shape),
        f"mesh_shape must be three integers (data, stage, tensor), got {shape!r}; "
        "e.g. --config.mesh_shape='(8,1,1)'",
    )
    _check(
        shape.count(-1) <= 1 and all(s > 0 or s == -1 for s in shape),
        f"mesh_shape {shape} must hold positive sizes and at most one -1",
    )
    resolved = resolve_shape(shape, num_devices)
    _check(
        -1 not in resolved and math.prod(resolved) == num_devices,
        f"mesh_shape {shape} needs {math.prod(s for s in shape if s > 0)}"
        f"{'*k' if -1 in shape else ''} devices but {num_devices} are present; "
        f"choose sizes whose product is {num_devices} (e.g. ({num_devices},1,1) or (-1,1,1))"
        + _fewer_devices_hint(shape, num_devices)
        + _device_count_note(config),
    )
    data, stage, tensor = resolved
    _check(
        tensor == 1 or config.sync.impl == "shard_map",
        "the tensor axis needs sync.impl=shard_map; pmap is data-parallel only",
    )
    _check(config.num_train_steps > 0, "num_train_steps must be positive")
    _check(config.global_batch_size > 0, "global_batch_size must be positive")
    _check(
        config.global_batch_size % data == 0,
        f"global_batch_size {config.global_batch_size} is not divisible by the data axis "
        f"({data} devices); use a multiple of {data}",
    )
    eval_bs = config.eval_batch_size or config.global_batch_size
    _check(
        eval_bs > 0 and eval_bs % data == 0,
        f"eval_batch_size {eval_bs} is not divisible by the data axis ({data}); "
        f"use a multiple of {data}",
    )
    _check(config.learning_rate > 0, "learning_rate must be positive")
    _check(config.warmup_steps >= 0, "warmup_steps must be >= 0")
    for key in ("schedule_steps", "hang_timeout_s", "stop_grace_s"):
        _check(config[key] >= 0, f"{key} must be >= 0 (0: the default behaviour, see base.py)")
    for key in ("log_every_steps",):
        _check(config[key] > 0, f"{key} must be positive")
    for key in ("eval_every_steps", "checkpoint_every_steps"):
        _check(config[key] >= 0, f"{key} must be >= 0 (0 turns it off)")
    _choice(config.lr_schedule, LR_SCHEDULES, "lr_schedule")
    _choice(config.optimizer.name, OPTIMIZERS, "optimizer.name")
    _check(0 <= config.optimizer.momentum < 1, "optimizer.momentum must be in [0, 1)")
    _choice(config.model.name, models.NAMES, "model.name")
    _check(config.model.width > 0, "model.width must be positive (1.0 = published VGG)")
    _choice(config.model.dtype, tuple(models.DTYPES), "model.dtype")
    _choice(config.model.head, ("auto", "cifar", "imagenet"), "model.head")
    _choice(config.pipeline.schedule, SCHEDULES, "pipeline.schedule")
    micro = config.pipeline.num_microbatches
    _check(micro >= 1, "pipeline.num_microbatches must be >= 1")
    stages.parse(config.pipeline.split)  # a policy name or cut points; bounds checked below
    if stage > 1:
        _check(
            config.pipeline.schedule != "naive" or micro == 1,
            f"pipeline.schedule=naive runs one micro-batch but num_microbatches={micro}; "
            "set --config.pipeline.num_microbatches=1 or use gpipe or 1f1b",
        )
        # Schedule combinations (pipeline efficiency, issue 12).
        schedule, v = config.pipeline.schedule, config.pipeline.virtual_stages
        _check(v >= 1, "pipeline.virtual_stages must be >= 1")
        _check(
            v == 1 or schedule == "interleaved",
            f"pipeline.virtual_stages={v} needs pipeline.schedule=interleaved",
        )
        _check(
            v == 1 or micro % stage == 0,
            f"pipeline.schedule=interleaved with virtual_stages={v} needs num_microbatches a "
            f"multiple of the {stage} stages (Megatron's rule); got {micro}",
        )
        _check(
            schedule != "zb-h1" or not config.pipeline.remat,
            "pipeline.schedule=zb-h1 splits the backward over stored residuals; "
            "set --config.pipeline.remat=False",
        )
        _check(
            config.sync.impl == "shard_map",
            "pipeline stages run with sync.impl=shard_map; pmap is data-parallel only",
        )
        for key, size in (
            ("global_batch_size", config.global_batch_size),
            ("eval_batch_size", eval_bs),
        ):
            _check(
                size % (data * micro) == 0,
                f"{key} {size} must divide into {micro} micro-batches of a multiple of "
                f"{data} (the data axis); use a multiple of {data * micro}",
            )
    _check_rules(config.tensor.rules)
    _choice(config.sync.impl, SYNC_IMPLS, "sync.impl")
    from jaxpar.parallel import sync  # the registry of sync modes (imported late: no cycle)

    _choice(config.sync.mode, tuple(sync.MODES), "sync.mode")
    reason = sync.check(config, data, stage, tensor)
    _check(reason is None, str(reason))
    _choice(config.sync.batch_norm, BN_SYNC, "sync.batch_norm")
    _check(config.host_device_count >= 1, "host_device_count must be >= 1")
    _check(config.checkpoint.max_to_keep >= 1, "checkpoint.max_to_keep must be >= 1")
    return resolved


def _check_rules(rules) -> None:
    """Sharding rules name known logical axes and existing mesh axes (or None)."""
    for rule in rules:
        _check(
            isinstance(rule, tuple) and len(rule) == 2,
            f"tensor.rules entries are (logical name, mesh axis) pairs, got {rule!r}; "
            'e.g. --config.tensor.rules=\'(("conv_out","tensor"),)\'',
        )
        name, axis = rule
        _check(
            name in LOGICAL_AXES,
            f"tensor.rules names {name!r}, which no layer uses; choose from "
            f"{', '.join(LOGICAL_AXES)}",
        )
        _check(
            axis is None or axis in AXES,
            f"tensor.rules maps {name!r} to mesh axis {axis!r}, which does not exist; use "
            f"{', '.join(AXES)} or None",
        )


def _fewer_devices_hint(shape: tuple[int, ...], num_devices: int) -> str:
    """The fix that keeps the user's mesh: run it on the first devices (config.num_devices)."""
    known = math.prod(s for s in shape if s > 0)
    wanted = num_devices // known * known if -1 in shape else known
    if not 0 < wanted < num_devices:
        return ""
    return f", or keep this mesh on the first {wanted} devices: --config.num_devices={wanted}"


def _device_count_note(config) -> str:
    """Why the device count may differ from host_device_count: XLA_FLAGS already set one."""
    found = re.search(
        r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
    )
    if found and int(found.group(1)) != config.host_device_count:
        return (
            f" (XLA_FLAGS already sets {found.group(1)} simulated devices, which overrides "
            f"host_device_count={config.host_device_count}; unset it or change it there)"
        )
    return ""
