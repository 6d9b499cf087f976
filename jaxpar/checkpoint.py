"""Orbax checkpoints of the layout-free state, in one place.

What is saved is the canonical state (`strategy.canonical`: per-layer parameters, batch
statistics and optimizer state of the same structure, and the step), never a stage-split or
replica-stacked carrier, plus a small JSON record of what the state belongs to. Restoring
places that state with whatever mesh the current config has (`strategy.place`), so a
checkpoint written under any mesh or device count resumes under any other. Data order derives
from the step, so the step is all the position a run needs. Reading one back, and what every
process found when it did, is jaxpar/checkpoint_read.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxpar.checkpoint_read import MISMATCH, UNREADABLE, Reader, agree
from jaxpar.errors import ConfigError, TrainingError
from jaxpar.run_spec import DEFAULTS

logger = logging.getLogger(__name__)

_CPU_HANDLER: list = []  # registered once per process


def fingerprint(config, model) -> dict[str, Any]:
    """What must match for a checkpoint's state to fit this config's model and optimizer (an
    adapting rate adds to the optimizer state: named only where there is one, so that the
    checkpoints of runs without stay readable)."""
    adapting = config.get("lr_adaptation", DEFAULTS.lr_adaptation)
    extra = {} if adapting == "none" else {"lr_adaptation": adapting}
    return {
        "model": model.name,
        "width": float(config.model.width),
        "batch_norm": bool(config.model.batch_norm),
        "layers": [layer.name for layer in model.layers],
        "input_shape": list(model.input_shape),
        "num_classes": model.num_classes,
        "num_params": model.num_params,
        "optimizer": config.optimizer.name,
        **extra,
    }


class Checkpointer:
    """Orbax CheckpointManager in WORKDIR/checkpoints: periodic asynchronous saves, the last
    `max_to_keep` kept, only finalised checkpoints ever listed (Orbax writes to a temporary
    folder and renames it when complete).

    When to save is Orbax's save decision policy, asked through `should_save`: a step that is
    a multiple of `every` (FixedIntervalPolicy, what `save_interval_steps` sets up), or the
    step the processes of a multi-process run agreed to stop at (PreemptionCheckpointingPolicy,
    JAX's preemption sync point). The policy is given explicitly rather than through
    `save_interval_steps`, because in orbax-checkpoint 0.12.8 that default also brings
    InitialSavePolicy, which saves the first step of every fresh run. `due(force=True)` adds
    the saves jaxpar always makes: after the last step and at a stop.

    A checkpoint that does not read back is moved aside to `unreadable-STEP` in the same folder
    (`restore`), so that it is never in the way of the saves that follow and never deleted.

    As a context manager it closes on the way out, letting a save in progress finish (it is
    a good checkpoint); on an exception a failure to finish is not raised over it."""

    def __init__(
        self,
        workdir: str,
        config,
        model,
        every: int,
        max_to_keep: int,
    ):
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        self.meta = fingerprint(config, model)
        self.restored_meta: dict = {}  # the JSON record of the checkpoint `restore` returned
        self.saved_step: int | None = None  # the last save this run started
        if jax.default_backend() == "cpu" and not _CPU_HANDLER:
            # Replica-parallel saving slices every replicated array across its replicas, which
            # compiles a slice program per shape and stalls the first save for seconds; simulated
            # devices share one host, so there is nothing to parallelise.
            ocp.type_handlers.register_type_handler(
                jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True
            )
            _CPU_HANDLER.append(True)
        policies = [ocp.checkpoint_managers.PreemptionCheckpointingPolicy()]
        if every:
            policies.insert(0, ocp.checkpoint_managers.FixedIntervalPolicy(every))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=True,
            create=True,
            save_decision_policy=ocp.checkpoint_managers.AnySavePolicy(policies),
        )
        # Handlers named up front, so that a checkpoint's tree can be read before its arrays.
        handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=handlers
        )
        # The same handlers again, for reads that each process makes alone.
        self._reader = Reader(self.manager, self.directory, self.meta)
        self._closed = False

    def due(self, step: int, force: bool = False) -> bool:
        """Whether to save `step`: Orbax's policy says so, or `force` (the last step, a stop);
        never a step that has a checkpoint already (Orbax's rule: only after the newest)."""
        if not force:
            return self.manager.should_save(step)
        latest = self.manager.latest_step()
        return latest is None or latest < step

    def save(
        self, step: int, canonical_state, schedule: dict | None = None, position: dict | None = None
    ) -> None:
        """Start an asynchronous save of `canonical_state` as checkpoint `step`, recording the
        learning-rate `schedule` it was trained with (optim.schedule_meta) and the run's
        `position` (the examples it has taken, its goodput schedule: loop.Loop)."""
        meta = {**self.meta, "schedule": schedule} if schedule else dict(self.meta)
        meta.update(position or {})
        with _writing(self.directory):
            started = self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(canonical_state),
                    meta=ocp.args.JsonSave(meta),
                ),
                force=True,
            )
        if started:
            self.saved_step = step

    def wait(self) -> None:
        """Wait for a save in progress to be complete on disk."""
        with _writing(self.directory):
            self.manager.wait_until_finished()

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self.manager.latest_step()

    def restore(self, target, set_aside: bool = True) -> tuple[Any, int] | None:
        """The newest checkpoint that every process reads back, as host arrays shaped like
        `target`, and its step; None if there is none.

        A checkpoint of another model, or one whose state has another structure (e.g. written
        with another synchronisation mode), is a one-line ConfigError, and nothing is moved.
        A checkpoint that does not read back (corrupt or incomplete files) is said in one line
        and, with `set_aside`, moved to `unreadable-STEP` in the same folder (kept, never
        deleted), then the next older one is tried: the unreadable one must not stay the
        newest, or every save at or below its step would be refused. Without `set_aside`
        (`--eval_only`, which writes nothing) it is left in place and skipped.

        With several processes, each reads the checkpoint itself and then they compare
        verdicts (jaxpar/checkpoint_read.py): one that any process cannot read is unreadable
        for all of them, so that they all resume from the same step or all start anew, never
        one from a step another cannot read (its own files damaged, a disk or cache only it
        sees)."""
        for step in sorted(self.manager.all_steps(), reverse=True):
            outcome = self._reader.attempt(step, target)
            verdicts = agree(outcome)
            mismatch = [text for kind, text in verdicts if kind == MISMATCH]
            if mismatch:  # another run's workdir: nothing is moved
                raise ConfigError(mismatch[0])
            failed = {p: text for p, (kind, text) in enumerate(verdicts) if kind == UNREADABLE}
            if failed:
                self._unreadable(step, failed, set_aside)
                continue
            state, meta = outcome
            self.restored_meta = dict(meta)
            return jax.tree.map(np.asarray, state), step
        return None

    def _unreadable(self, step: int, failed: dict[int, str], set_aside: bool) -> None:
        """Say that checkpoint `step` does not read back (`failed`: the processes that could
        not read it, with why) and, with `set_aside`, move it to `unreadable-STEP` (process 0
        moves it; every process then lists the folder again)."""
        older = [s for s in self.manager.all_steps() if s < step]
        n = jax.process_count()
        then = "every process trying" if n > 1 else "trying"
        then = f"{then} the checkpoint of step {max(older)}" if older else "no older checkpoint"
        where = ""
        if len(failed) < n:  # the others read it: say which could not
            names = ", ".join(map(str, sorted(failed)))
            where = f" in process{'es' if len(failed) > 1 else ''} {names} of {n}"
        why = failed[min(failed)]
        source = os.path.join(self.directory, str(step))
        if not set_aside:
            logger.info(
                f"checkpoint {step} in {self.directory} does not read back{where} ({why}); "
                f"left in place, {then}"
            )
            return
        aside = _free_path(os.path.join(self.directory, f"unreadable-{step}"))
        if jax.process_index() == 0:
            try:
                os.rename(source, aside)
            except OSError as e:
                raise TrainingError(
                    f"checkpoint {step} in {self.directory} does not read back{where} ({why}) "
                    f"and cannot be moved aside to {aside}: {e.strerror or e}. Move {source} out "
                    "of the way yourself and rerun"
                ) from None
            logger.info(
                f"checkpoint {step} does not read back{where} ({why}); moved it aside to "
                f"{aside} (kept, not deleted), "
                f"{then if older else then + ', so the run starts anew'}"
            )
        if n > 1:
            ocp.multihost.sync_global_processes(f"jaxpar_checkpoint_{step}_set_aside")
        self.manager.reload()

    def close(self) -> None:
        """Wait for a save in progress, then release the manager and the readers (once; later
        calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.wait()
        finally:
            self.manager.close()
            self._reader.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type, *exc_info: object) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # the exception on its way out says more
            self.close()


@contextlib.contextmanager
def _writing(directory: str):
    """Turn a failed write (permissions, a full disk, a path that became a file) into one line."""
    try:
        yield
    except OSError as e:
        raise TrainingError(
            f"cannot write checkpoints to {directory}: {e.strerror or e}; the newest complete "
            "checkpoint there is kept. Make the workdir writable and rerun to resume"
        ) from None


def _free_path(path: str) -> str:
    """`path`, or `path.2`, `path.3`, ... : the first that does not exist."""
    candidate, n = path, 1
    while os.path.lexists(candidate):
        n += 1
        candidate = f"{path}.{n}"
    return candidate
