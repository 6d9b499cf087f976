"""Reading one checkpoint back, and every process's verdict on it (`Checkpointer.restore` in
jaxpar/checkpoint.py asks).

A process reads a checkpoint alone (`Reader.attempt`): its JSON record must be this config's
(model, optimizer, ...), its state's structure and shapes this config's state's, and its files
must read back. Orbax's item handlers are called directly: the manager's `restore` ends at a
barrier of every process, which a process whose read failed would never reach (the processes'
later barriers would then pair wrongly). The processes then exchange what each found (`agree`),
so that a checkpoint any of them cannot read is unreadable for all of them.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from jaxpar import oneline
from jaxpar.errors import ConfigError

# What a process found when it read a checkpoint (`agree`)
READ, UNREADABLE, MISMATCH = 0, 1, 2
_TEXT_BYTES = 1024  # the most of a verdict's message that is passed on


class Unreadable(Exception):
    """A checkpoint's files do not read back (the message says why in one line)."""


class Reader:
    """Reads the checkpoints of `manager` (in `directory`) by this process alone, checking
    each against `meta`, the record this config's checkpoints carry (checkpoint.fingerprint)."""

    def __init__(self, manager: ocp.CheckpointManager, directory: str, meta: dict):
        self.manager, self.directory, self.meta = manager, directory, meta
        self._handlers = {
            "state": ocp.StandardCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        }

    def attempt(self, step: int, target):
        """(state, meta) of checkpoint `step` as this process reads it, or the ConfigError or
        `Unreadable` that says why not."""
        try:
            meta = self._read(step, "meta", ocp.args.JsonRestore())
            self._check_meta(meta, step)
            self._check_structure(step, target)
            return self._read(step, "state", ocp.args.StandardRestore(target)), meta
        except ConfigError as e:
            return e
        except Unreadable as e:
            _quiet_closed_loops()
            return e

    def close(self) -> None:
        for handler in self._handlers.values():
            handler.close()

    def _read(self, step: int, item: str, args):
        """Item `item` of checkpoint `step`; any failure to read is `Unreadable`."""
        path = epath.Path(self.directory) / str(step) / item
        try:
            return self._handlers[item].restore(path, args=args)
        except Exception as e:  # whatever the files do, they do not read back
            raise Unreadable(_why(e)) from e

    def _check_meta(self, meta: dict, step: int) -> None:
        """A one-line ConfigError if checkpoint `step` was written for another config."""
        for key, value in self.meta.items():
            if meta.get(key) != value:
                raise ConfigError(
                    f"checkpoint {step} in {self.directory} was written for {key}="
                    f"{_short(meta.get(key))}, this config has {key}={_short(value)}; use "
                    "another --workdir or the settings it was written with"
                )

    def _check_structure(self, step: int, target) -> None:
        """A one-line ConfigError if checkpoint `step` holds a state of another structure or
        shapes than `target`; `Unreadable` if its tree cannot be read."""
        try:
            tree = self.manager.item_metadata(step)["state"].tree
        except Exception as e:  # missing or corrupt tree metadata
            raise Unreadable(_why(e)) from e
        saved = ocp.tree.to_flat_dict(tree)
        wanted = ocp.tree.to_flat_dict(ocp.tree.serialize_tree(target, keep_empty_nodes=True))
        extra, missing = sorted(set(saved) - set(wanted)), sorted(set(wanted) - set(saved))
        if extra or missing:
            parts = [f"holds {_entries(extra)}, which this config's state lacks"] if extra else []
            if missing:
                parts.append(f"lacks {_entries(missing)}, which this config's state has")
            raise ConfigError(
                f"checkpoint {step} in {self.directory} holds another state: it "
                f"{' and '.join(parts)} (written with another synchronisation mode or "
                "optimizer?); use another --workdir or the settings it was written with"
            )
        for key, value in wanted.items():
            shape = tuple(getattr(saved[key], "shape", None) or ())
            if shape != tuple(np.shape(value)):
                raise ConfigError(
                    f"checkpoint {step} in {self.directory} holds {'.'.join(map(str, key))} "
                    f"of shape {shape}, this config's is {tuple(np.shape(value))}; use "
                    "another --workdir or the settings it was written with"
                )


def agree(outcome) -> list[tuple[int, str]]:
    """Every process's verdict on one checkpoint, in process order: (READ, ""), (UNREADABLE,
    why) or (MISMATCH, the ConfigError's message), from `outcome`, what `Reader.attempt`
    returned in each. One process_allgather of 1 KiB per process across all of them (gloo on
    CPU), which every process reaches: their reads have no barrier in them. One process: its
    own."""
    if isinstance(outcome, ConfigError):
        kind, text = MISMATCH, str(outcome)
    elif isinstance(outcome, Unreadable):
        kind, text = UNREADABLE, str(outcome)
    else:
        kind, text = READ, ""
    if jax.process_count() == 1:
        return [(kind, text)]
    row = np.zeros(1 + _TEXT_BYTES, np.uint8)  # the kind, then the text (NUL-padded)
    raw = text.encode()[:_TEXT_BYTES]
    row[0], row[1 : 1 + len(raw)] = kind, np.frombuffer(raw, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(row))
    return [(int(r[0]), bytes(r[1:]).rstrip(b"\0").decode(errors="ignore")) for r in rows]


def _quiet_closed_loops() -> None:
    """Drop the "Event loop is closed" errors a failed read leaves behind: TensorStore still
    completes the other reads of the checkpoint that failed and calls back into the asyncio
    loop Orbax has closed, and Python prints each as a traceback (up to hundreds, after the
    one line that said the checkpoint does not read back). Nothing else is dropped."""
    previous = sys.unraisablehook
    if getattr(previous, "_jaxpar_quiet", False):
        return

    def hook(unraisable) -> None:
        error = unraisable.exc_value
        if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
            return
        previous(unraisable)

    hook._jaxpar_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _why(error: BaseException) -> str:
    """A failure to read, in one short line: its type and the first line of its message."""
    return f"{type(error).__name__}: {_short(oneline.first_line(error), 120)}"


def _entries(keys: list[tuple]) -> str:
    """State entries by their dotted paths: the first three, then how many more."""
    names = [".".join(map(str, key)) for key in keys]
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def _short(value: Any, limit: int = 40) -> str:
    text = str(value)
    return text if len(text) < limit else text[: limit - 3] + "..."
