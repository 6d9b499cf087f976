"""The run's working directory: checked before anything compiles, and held by one run at a time.

Two runs training in one workdir would both start from the same checkpoint and interleave
their metrics and saves. `Lock` takes an exclusive `fcntl` lock on WORKDIR/.lock; the kernel
drops it when the process ends, however it ends, so a killed run never leaves a stale lock.
"""

from __future__ import annotations

import errno
import fcntl
import os

from jaxpar.errors import TrainingError


def prepare(workdir: str) -> str:
    """Create `workdir` if needed and check that it is a writable directory (one-line errors)."""
    path = os.path.abspath(workdir)
    parent = path
    while not os.path.exists(parent):  # the nearest existing ancestor decides
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise TrainingError(
            f"workdir {workdir} cannot be created: {parent} is a file, not a directory; "
            "choose another --workdir"
        )
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise TrainingError(
            f"workdir {workdir} cannot be created ({e.strerror}); choose another --workdir"
        ) from None
    probe = os.path.join(path, ".write-test")
    try:
        with open(probe, "w", encoding="utf-8") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise TrainingError(
            f"workdir {workdir} is not writable ({e.strerror}); fix its permissions or choose "
            "another --workdir"
        ) from None
    return path


class Lock:
    """Exclusive lock on WORKDIR/.lock for the life of a run; `TrainingError` if held."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, ".lock")
        self._fd: int | None = None

    def __enter__(self) -> Lock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise TrainingError(
                    f"another run (pid {other}) is training in {os.path.dirname(self.path)}; "
                    "wait for it to finish or choose another --workdir"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
