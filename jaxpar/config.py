"""Validate a ConfigDict before anything compiles: one-line errors that say how to fix them.

This module checks what every run shares (mesh shape, batch sizes, optimiser, model). The keys
of a partitioning (pipeline schedule, tensor rules, sync mode) are checked by `jaxpar.parallel`:
`parallel.validate` runs these checks and then the chosen strategy's own `check`, so config.py
imports nothing of parallel.
"""

from __future__ import annotations

import math
import os
import re

import jax
import ml_collections

from jaxpar import models
from jaxpar.errors import ConfigError
from jaxpar.mesh import AXES, resolve_shape

OPTIMIZERS = ("sgd", "adam", "lars")
LR_SCHEDULES = ("cosine", "constant")
SYNC_IMPLS = ("shard_map", "pmap")
BN_SYNC = ("global", "local")


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def choice(value, allowed, key: str) -> None:
    check(value in allowed, f"unknown {key} {value!r}; choose one of {', '.join(allowed)}")


def device_count(config: ml_collections.ConfigDict, present: int) -> int:
    """How many of the `present` devices the run uses: config.num_devices, or all (0)."""
    wanted = config.get("num_devices", 0)
    check(
        isinstance(wanted, int) and 0 <= wanted <= present,
        f"num_devices {wanted!r} must be between 0 (all) and the {present} devices present",
    )
    return wanted or present


def validate(config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
    """Check the keys every run shares against `num_devices`; return the resolved
    (data, stage, tensor) shape. Use `jaxpar.parallel.validate` for the whole check."""
    shape = tuple(config.mesh_shape)
    check(
        len(shape) == len(AXES) and all(isinstance(s, int) for s in shape),
        f"mesh_shape must be three integers (data, stage, tensor), got {shape!r}; "
        "e.g. --config.mesh_shape='(8,1,1)'",
    )
    check(
        shape.count(-1) <= 1 and all(s > 0 or s == -1 for s in shape),
        f"mesh_shape {shape} must hold positive sizes and at most one -1",
    )
    resolved = resolve_shape(shape, num_devices)
    check(
        -1 not in resolved and math.prod(resolved) == num_devices,
        f"mesh_shape {shape} needs {math.prod(s for s in shape if s > 0)}"
        f"{'*k' if -1 in shape else ''} devices but {num_devices} are present; "
        f"choose sizes whose product is {num_devices} (e.g. ({num_devices},1,1) or (-1,1,1))"
        + _fewer_devices_hint(shape, num_devices)
        + _device_count_note(config),
    )
    data = resolved[0]
    check(config.num_train_steps > 0, "num_train_steps must be positive")
    check(config.global_batch_size > 0, "global_batch_size must be positive")
    check(
        config.global_batch_size % data == 0,
        f"global_batch_size {config.global_batch_size} is not divisible by the data axis "
        f"({data} devices); use a multiple of {data}",
    )
    eval_bs = config.eval_batch_size or config.global_batch_size
    check(
        eval_bs > 0 and eval_bs % data == 0,
        f"eval_batch_size {eval_bs} is not divisible by the data axis ({data}); "
        f"use a multiple of {data}",
    )
    check(config.learning_rate > 0, "learning_rate must be positive")
    check(config.lr_base_batch_size > 0, "lr_base_batch_size must be positive")
    check(config.warmup_steps >= 0, "warmup_steps must be >= 0")
    for key in ("schedule_steps", "hang_timeout_s", "stop_grace_s", "eval_train_examples"):
        check(config[key] >= 0, f"{key} must be >= 0 (0: the default behaviour, see base.py)")
    for key in ("log_every_steps",):
        check(config[key] > 0, f"{key} must be positive")
    for key in ("eval_every_steps", "checkpoint_every_steps"):
        check(config[key] >= 0, f"{key} must be >= 0 (0 turns it off)")
    choice(config.lr_schedule, LR_SCHEDULES, "lr_schedule")
    choice(config.optimizer.name, OPTIMIZERS, "optimizer.name")
    check(0 <= config.optimizer.momentum < 1, "optimizer.momentum must be in [0, 1)")
    choice(config.model.name, models.NAMES, "model.name")
    check(config.model.width > 0, "model.width must be positive (1.0 = published VGG)")
    choice(config.model.dtype, tuple(models.DTYPES), "model.dtype")
    check(
        config.model.dtype != "float64" or jax.config.jax_enable_x64,
        "model.dtype=float64 needs JAX's 64-bit mode: set JAX_ENABLE_X64=1 (it is meant for "
        "numerical checks; float32 and bfloat16 are the training dtypes)",
    )
    choice(config.model.head, ("auto", "cifar", "imagenet"), "model.head")
    choice(config.sync.impl, SYNC_IMPLS, "sync.impl")
    choice(config.sync.batch_norm, BN_SYNC, "sync.batch_norm")
    check(config.host_device_count >= 1, "host_device_count must be >= 1")
    check(config.checkpoint.max_to_keep >= 1, "checkpoint.max_to_keep must be >= 1")
    return resolved


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
