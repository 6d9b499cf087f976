"""Continuing a run in a workdir that has checkpoints: what a rerun may and may not change.

A rerun resumes from the newest checkpoint (`initial_state`). It must not change the
learning rate of the steps behind the user's back (`check_schedule`), and a rerun of a
finished run, or one asking for fewer steps than the run has done, leaves it as it is
(`finished`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpar import batch_schedule, console, optim, run_setup, units
from jaxpar import metrics as metrics_lib
from jaxpar.errors import ConfigError
from jaxpar.run_spec import RateRule, RunSpec
from jaxpar.summary_record import RunResult

logger = logging.getLogger(__name__)


def initial_state(strategy, spec: RunSpec, ckpt, restored) -> tuple[Any, int]:
    """The placed state to train from and its step: the `restored` checkpoint's (a pair of
    host state and step, from `ckpt.restore`), or a new one."""
    if restored is None:
        return strategy.init_state(jax.random.key(spec.seed)), 0
    host_state, start = restored
    check_schedule(spec.rate, ckpt.restored_meta, start)
    state = strategy.place(host_state)
    logger.info(f"resumed from the checkpoint of step {start} in {ckpt.directory}")
    return state, start


def resumed_setup(setup, step: int, meta: dict):
    """The run's setup at a restored checkpoint of `step`: its data position taken over from
    the checkpoint's record (examples taken by then; a checkpoint without one had kept its
    batch: step x batch), and under a goodput schedule the batch and mesh it was on."""
    examples = meta.get("examples", step * setup.spec.batches.global_size)
    phase = batch_schedule.resumed_phase(meta) if setup.spec.goodput_schedule else None
    if phase is None:
        return dataclasses.replace(setup, origin=(step, int(examples)))
    return run_setup.derive(setup, batch_schedule.changes(phase), (step, int(examples)))


def finished(workdir: str, step: int, rate: RateRule) -> RunResult:
    """A rerun of a finished run: say so, show its summary, change nothing. A checkpoint past
    `num_train_steps` (the rerun asks for fewer steps than the run has done) is the same case:
    a run never goes back to an earlier step, which would mean saving checkpoints below newer
    ones (Orbax lists steps by number: the newer ones would still be resumed from)."""
    summary = metrics_lib.last_summary(workdir)
    span = optim.schedule_steps(rate)
    total = rate.train_steps
    if rate.adaptation != "none":  # its length is progress, not steps
        logger.info(
            f"the run in {workdir} is finished: its checkpoint at step {step} has made the "
            f"progress of {total} steps at lr_base_batch_size; nothing to train. To continue, "
            "raise --config.num_train_steps (the progress to reach) and add "
            f"--config.schedule_steps={span} to keep its learning-rate schedule; or add "
            "--eval_only to evaluate"
        )
    elif step > total:
        logger.info(
            f"the run in {workdir} is already past step {total}: its newest checkpoint is at "
            f"step {step}, and a run never goes back to an earlier step; nothing to train. To "
            f"continue it, raise --config.num_train_steps above {step}; to train from an "
            "earlier checkpoint, copy its folder (checkpoints/STEP) into the checkpoints "
            "folder of a new --workdir; or add --eval_only to evaluate"
        )
    else:
        logger.info(
            f"the run in {workdir} is finished: its checkpoint is at step {step} of {total}; "
            "nothing to train. To continue, raise --config.num_train_steps and add "
            f"--config.schedule_steps={span} to keep its learning-rate schedule (the rate stays "
            "at its end value) or a larger value to stretch it; or add --eval_only to evaluate"
        )
    if summary is not None:
        logger.info(console.summary_table(summary))
    return RunResult(summary, finished=True)


def check_schedule(rate: RateRule, restored_meta: dict, start: int) -> None:
    """Continuing a run must not change the learning rate of its steps behind the user's back:
    a schedule whose rate differs at any step from the one in `restored_meta` (the restored
    checkpoint's record; usually a raised num_train_steps stretching the cosine) is refused in
    one line unless `schedule_steps` is given explicitly, and then said plainly."""
    before = restored_meta.get("schedule")
    if not before or before == optim.schedule_meta(rate):
        return
    steps = jnp.arange(rate.train_steps)
    old = np.asarray(optim.make_schedule(_with_schedule(rate, before))(steps))
    new = np.asarray(optim.make_schedule(rate)(steps))
    differ = np.flatnonzero(~np.isclose(old, new, rtol=1e-6, atol=0.0))
    if differ.size == 0:  # e.g. a constant rate over a longer run: nothing changes
        return
    at = int(differ[0])
    rates = (
        f"the rate at step {at + 1} is {units.rate(float(new[at]))} instead of "
        f"{units.rate(float(old[at]))}"
    )
    if rate.schedule_steps:  # asked for explicitly: go on, and say what changes
        logger.info(f"learning-rate schedule changed on resuming at step {start}: {rates}")
        return
    raise ConfigError(
        f"this run was trained on a {before['schedule_steps']}-step {before['lr_schedule']} "
        f"learning-rate schedule, and this config changes it: {rates}. Keep the old one with "
        f"--config.schedule_steps={before['schedule_steps']} (and the run's other "
        "learning-rate settings), or accept the new one with --config.schedule_steps="
        f"{optim.schedule_steps(rate)}"
    )


def _with_schedule(rate: RateRule, meta: dict) -> RateRule:
    """`rate` with the learning-rate settings of a checkpoint's schedule record."""
    return dataclasses.replace(
        rate,
        schedule=meta["lr_schedule"],
        warmup_steps=meta["warmup_steps"],
        learning_rate=meta["peak_learning_rate"],
        linear_scaling=False,
        schedule_steps=meta["schedule_steps"],
    )
