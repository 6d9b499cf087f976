"""Orbax checkpoints of the layout-free state, in one place.

What is saved is the canonical state (`strategy.canonical`: per-layer parameters, batch
statistics and optimizer state of the same structure, and the step), never a stage-split or
replica-stacked carrier, plus a small JSON record of what the state belongs to. Restoring
places that state with whatever mesh the current config has (`strategy.place`), so a
checkpoint written under any mesh or device count resumes under any other. Data order derives
from the step, so the step is all the position a run needs.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxpar.errors import ConfigError, TrainingError

log = logging.getLogger("jaxpar")
_CPU_HANDLER: list = []  # registered once per process


def fingerprint(config, model) -> dict[str, Any]:
    """What must match for a checkpoint's state to fit this config's model and optimizer."""
    return {
        "model": model.name,
        "width": float(config.model.width),
        "batch_norm": bool(config.model.batch_norm),
        "layers": [layer.name for layer in model.layers],
        "input_shape": list(model.input_shape),
        "num_classes": model.num_classes,
        "num_params": model.num_params,
        "optimizer": config.optimizer.name,
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

    As a context manager it closes on the way out, letting a save in progress finish (it is
    a good checkpoint); on an exception a failure to finish is not raised over it."""

    def __init__(self, workdir: str, config, model, every: int, max_to_keep: int):
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        self.meta = fingerprint(config, model)
        self.restored_meta: dict = {}  # the JSON record of the checkpoint `restore` returned
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
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self._closed = False

    def due(self, step: int, force: bool = False) -> bool:
        """Whether to save `step`: Orbax's policy says so, or `force` (the last step, a stop);
        never a step that has a checkpoint already (Orbax's rule: only after the newest)."""
        if not force:
            return self.manager.should_save(step)
        latest = self.manager.latest_step()
        return latest is None or latest < step

    def save(self, step: int, canonical_state, schedule: dict | None = None) -> None:
        """Start an asynchronous save of `canonical_state` as checkpoint `step`, recording the
        learning-rate `schedule` it was trained with (optim.schedule_meta)."""
        meta = {**self.meta, "schedule": schedule} if schedule else self.meta
        with _writing(self.directory):
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(canonical_state),
                    meta=ocp.args.JsonSave(meta),
                ),
                force=True,
            )

    def wait(self) -> None:
        """Wait for a save in progress to be complete on disk."""
        with _writing(self.directory):
            self.manager.wait_until_finished()

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self.manager.latest_step()

    def restore(self, target) -> tuple[Any, int] | None:
        """The newest checkpoint that reads back whole, as host arrays shaped like `target`;
        None if there is none. A newer one that fails to read is reported and skipped (never
        deleted); a checkpoint of another model is a one-line ConfigError."""
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                meta = self.manager.restore(
                    step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
                ).meta
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is skipped
                log.warning("checkpoint %d in %s is unreadable (%s); trying an older one",
                            step, self.directory, type(e).__name__)  # fmt: skip
                continue
            self._check(meta, step)
            try:
                restored = self.manager.restore(
                    step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
                ).state
            except Exception as e:  # noqa: BLE001
                log.warning("checkpoint %d in %s is corrupt (%s); trying an older one",
                            step, self.directory, type(e).__name__)  # fmt: skip
                continue
            self.restored_meta = dict(meta)
            return jax.tree.map(np.asarray, restored), step
        return None

    def _check(self, meta: dict, step: int) -> None:
        for key, value in self.meta.items():
            if meta.get(key) != value:
                raise ConfigError(
                    f"checkpoint {step} in {self.directory} was written for {key}="
                    f"{_short(meta.get(key))}, this config has {key}={_short(value)}; use "
                    "another --workdir or the settings it was written with"
                )

    def close(self) -> None:
        """Wait for a save in progress, then release the manager (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.wait()
        finally:
            self.manager.close()

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


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) < 40 else text[:37] + "..."
