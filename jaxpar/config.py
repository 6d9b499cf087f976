"""Validate a ConfigDict before anything compiles: one-line errors that say how to fix them.

This module checks what every run shares (mesh shape, batch sizes, optimiser, model). The keys
of a partitioning (pipeline schedule, tensor rules, sync mode) are checked by `jaxpar.parallel`:
`parallel.validate` runs these checks and then the chosen strategy's own `check`, so config.py
imports nothing of parallel; `parallel.resolve` then turns the checked config into the run's
typed value (jaxpar/run_spec.py). A key a config lacks reads configs/base.py's value
(`run_spec.DEFAULTS`).
"""

from __future__ import annotations

import math

import jax
import ml_collections

from jaxpar import axes, configfile, models
from jaxpar import mesh as mesh_lib
from jaxpar.errors import ConfigError
from jaxpar.mesh import resolve_shape
from jaxpar.run_spec import ADAPTATIONS, DEFAULTS

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
    wanted = config.get("num_devices", DEFAULTS.num_devices)
    check(
        isinstance(wanted, int) and 0 <= wanted <= present,
        f"num_devices {wanted!r} must be between 0 (all) and the {present} devices present",
    )
    return wanted or present


def validate(config: ml_collections.ConfigDict, num_devices: int) -> dict[str, int]:
    """Check the keys every run shares against `num_devices`; return the resolved mesh,
    {axis: size} in mesh order. Use `jaxpar.parallel.validate` for the whole check."""
    sizes = _check_mesh(config, num_devices)
    _check_batches(config, sizes)
    _check_settings(config)
    return sizes


def _check_mesh(config: ml_collections.ConfigDict, num_devices: int) -> dict[str, int]:
    """mesh_axes and mesh_shape against `num_devices`, each axis' own check; the sizes."""
    check(
        config.get("mesh_axes", None) is None or len(tuple(config.mesh_axes)) > 0,
        "mesh_axes is empty; name the mesh's axes, e.g. --config.mesh_axes='(\"data\",)' "
        "--config.mesh_shape='(-1,)', or leave it out for the default (data, stage, tensor)",
    )
    names = mesh_lib.axis_names(config)
    shape = tuple(config.mesh_shape)
    known = ", ".join(axes.names())
    for name in names:
        check(
            axes.registered(name),
            f"mesh_axes names {name!r}, which is not a mesh axis; choose from {known} "
            "(a new axis is one module that registers it: jaxpar/axes/)",
        )
    check(len(set(names)) == len(names), f"mesh_axes {names} names an axis twice")
    fix = mesh_lib.example(names, num_devices)
    check(
        len(shape) == len(names) and all(isinstance(s, int) for s in shape),
        f"mesh_shape must be {len(names)} integers, one per axis of mesh_axes {names}, got "
        f"{shape!r}; e.g. {fix}",
    )
    check(
        shape.count(-1) <= 1 and all(s > 0 or s == -1 for s in shape),
        f"mesh_shape {shape} must hold positive sizes and at most one -1",
    )
    for name in names[1:]:
        check(
            not axes.get(name).outermost,
            f"the {name} axis must come first in mesh_axes (its indices are blocks of "
            f"consecutive devices: processes, nodes), got {names}; e.g. "
            f"--config.mesh_axes='{_tuple((name, *[a for a in names if a != name]))}'",
        )
    resolved = resolve_shape(shape, num_devices)
    check(
        -1 not in resolved and math.prod(resolved) == num_devices,
        f"mesh {axes.spelled(dict(zip(names, shape)))} needs "
        f"{math.prod(s for s in shape if s > 0)}{'*k' if -1 in shape else ''} devices but "
        f"{num_devices} are present; choose sizes whose product is {num_devices}, e.g. {fix}"
        + _fewer_devices_hint(shape, num_devices)
        + _device_count_note(config),
    )
    sizes = dict(zip(names, resolved))
    for name in names:
        reason = axes.get(name).check(config, sizes)
        check(reason is None, str(reason))
    return sizes


def _check_batches(config: ml_collections.ConfigDict, sizes: dict[str, int]) -> None:
    """The step count and both batch sizes, which the batch axes' replicas must divide."""
    data = axes.num_replicas(sizes)
    over = (
        "the batch axes " + " x ".join(axes.batch_axes(sizes))
        if len(axes.batch_axes(sizes)) > 1
        else "the data axis"
    )
    check(config.num_train_steps > 0, "num_train_steps must be positive")
    check(config.global_batch_size > 0, "global_batch_size must be positive")
    check(
        config.global_batch_size % data == 0,
        f"global_batch_size {config.global_batch_size} is not divisible by {over} "
        f"({data} replicas); use a multiple of {data}",
    )
    eval_bs = config.eval_batch_size or config.global_batch_size
    check(
        eval_bs > 0 and eval_bs % data == 0,
        f"eval_batch_size {eval_bs} is not divisible by {over} ({data} replicas); "
        f"use a multiple of {data}",
    )


def _check_settings(config: ml_collections.ConfigDict) -> None:
    """The optimiser, schedule, model and loop keys, each on its own."""
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
    _check_target(config)
    choice(config.optimizer.name, OPTIMIZERS, "optimizer.name")
    check(0 <= config.optimizer.momentum < 1, "optimizer.momentum must be in [0, 1)")
    check((reason := models.check_name(config.model.name)) is None, str(reason))
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


def _check_target(config: ml_collections.ConfigDict) -> None:
    """The time-to-target keys and the learning-rate rule across batch sizes."""
    accuracy = config.get("target_accuracy", DEFAULTS.target_accuracy)
    check(0 <= accuracy <= 1, f"target_accuracy must be in [0, 1] (0: none), got {accuracy}")
    check(
        config.get("target_eval_loss", DEFAULTS.target_eval_loss) >= 0,
        "target_eval_loss must be >= 0 (0: none)",
    )
    if config.get("stop_at_target", DEFAULTS.stop_at_target):
        check(
            accuracy > 0 or config.get("target_eval_loss", DEFAULTS.target_eval_loss) > 0,
            "stop_at_target=True needs a target: set --config.target_accuracy (or "
            "--config.target_eval_loss)",
        )
        check(
            config.eval_every_steps > 0,
            "stop_at_target=True needs evaluations during the run: set "
            "--config.eval_every_steps to a positive step count",
        )
    noise = config.get("lr_noise_scale", DEFAULTS.lr_noise_scale)
    check(noise >= 0, f"lr_noise_scale must be >= 0 (0: off), got {noise}")
    check(
        not (noise and config.lr_linear_scaling),
        "lr_linear_scaling and lr_noise_scale are two rules for the same rate; set one",
    )
    decay = config.get("noise_scale_decay", DEFAULTS.noise_scale_decay)
    check(0 <= decay < 1, f"noise_scale_decay must be in [0, 1), got {decay}")
    _check_adaptation(config)


def _check_adaptation(config: ml_collections.ConfigDict) -> None:
    """lr_adaptation against the other rate rules and the optimizer (whether the run measures
    the noise it needs is the strategy's to say: run_setup asks it)."""
    adapt = config.get("lr_adaptation", DEFAULTS.lr_adaptation)
    choice(adapt, ADAPTATIONS, "lr_adaptation")
    if adapt == "none":
        return
    check(
        not config.lr_linear_scaling and not config.get("lr_noise_scale", DEFAULTS.lr_noise_scale),
        f"lr_adaptation={adapt} scales the rate by the measured noise itself; drop "
        "lr_linear_scaling and lr_noise_scale (learning_rate is the rate at "
        "lr_base_batch_size)",
    )
    check(
        config.optimizer.name in ("sgd", "adam"),
        f"lr_adaptation={adapt} scales the rate after the optimizer's direction (sgd, adam); "
        f"{config.optimizer.name} applies its rate inside its momentum",
    )
    check(
        config.get("measure_noise_scale", DEFAULTS.measure_noise_scale),
        f"lr_adaptation={adapt} takes its gain from the gradient noise scale; drop "
        "measure_noise_scale=False",
    )


def _tuple(names) -> str:
    return "(" + ",".join(f'"{n}"' for n in names) + ")"


def _fewer_devices_hint(shape: tuple[int, ...], num_devices: int) -> str:
    """The fix that keeps the user's mesh: run it on the first devices (config.num_devices)."""
    known = math.prod(s for s in shape if s > 0)
    wanted = num_devices // known * known if -1 in shape else known
    if not 0 < wanted < num_devices:
        return ""
    return f", or keep this mesh on the first {wanted} devices: --config.num_devices={wanted}"


def _device_count_note(config) -> str:
    """Why the device count may differ from host_device_count: XLA_FLAGS already set one."""
    found = configfile.host_device_count()
    if found is not None and found != config.host_device_count:
        return (
            f" (XLA_FLAGS already sets {found} simulated devices, which overrides "
            f"host_device_count={config.host_device_count}; unset it or change it there)"
        )
    return ""
