"""Every way a run can stall ends in one line: no progress, a stop it cannot honour, a lost launcher.

One daemon thread per process watches the run while the main thread works:

- **Progress.** The loop calls `beat` after every step, evaluation batch and checkpoint save.
  When nothing has happened for longer than `limit()` (the configured `hang_timeout_s`, or
  FACTOR times the median interval between recent beats if that is longer), the thread writes
  every thread's Python stack to stderr (`faulthandler`), then one line saying that the run
  hung, what it last finished and where the main thread is, and exits 1. In a multi-process run
  a hang anywhere stops every process's progress, so each one reports its own place (and a
  process that has left is reported as lost by the others, jaxpar.cluster).
- **Stop requests.** Python runs signal handlers only between bytecodes of the main thread, so a
  main thread stuck in a C++ wait never sees Ctrl-C. The thread reads signals through
  `signal.set_wakeup_fd` (the C-level handler writes each signal number to a pipe at once) and,
  across processes, the preemption notice JAX's coordination service records for a SIGTERM to
  any process. The loop saves and stops at its next step as before; if the process is still
  alive `grace_s` after the request, one line says so and it exits 1 without saving. A second
  Ctrl-C stops at once (exit 130).
- **The launcher.** A worker started by launch/local.py exits when its launcher is gone (the
  launcher also asks the kernel to kill it then, PR_SET_PDEATHSIG; this is the check in the
  worker for where that is not available).

`JAXPAR_TEST_HANG=PROCESS:STEP` makes that process sleep inside that step, for the tests.
"""

from __future__ import annotations

import collections
import faulthandler
import os
import select
import signal
import statistics
import sys
import threading
import time

from jaxpar import cluster, jax_internals

FACTOR = 20  # a beat interval this many times the recent median counts as a hang
COMPILE_S = 600  # the least time allowed for work that compiles programs (first step, eval)
POLL_S = 0.5
LAUNCHER_ENV = "JAXPAR_LAUNCHER_PID"
HANG_ENV = "JAXPAR_TEST_HANG"


class Watchdog:
    """Watches one run; `start()` it, `beat()` on progress, `stop()` at the end."""

    def __init__(self, hang_s: float, grace_s: float):
        self.hang_s, self.grace_s = float(hang_s), float(grace_s)
        self.last_beat = time.monotonic()
        self.last_what = "nothing yet"
        self.doing_what = "starting"
        self.compiling = False
        self.intervals: collections.deque = collections.deque(maxlen=20)
        self.asked = False  # a stop was requested (a second Ctrl-C then stops at once)
        self.stop_asked_at: float | None = None  # when; None once the loop is honouring it
        self.stop_name = ""
        self._stopped = threading.Event()
        self._fds: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._previous_fd: int | None = None
        self._launcher = int(os.environ.get(LAUNCHER_ENV, "0") or 0)
        self._coordination = None  # jax_internals.Coordination, once multi-process

    # -- what the loop calls ------------------------------------------------------------------

    def beat(self, what: str) -> None:
        """Progress: `what` (e.g. "step 12") just finished."""
        now = time.monotonic()
        if not self.compiling:  # a compile is no measure of the step time
            self.intervals.append(now - self.last_beat)
        self.last_beat, self.last_what, self.compiling = now, what, False

    def doing(self, what: str, compiling: bool = False) -> None:
        """What the run is busy with now (named in the hang line); not progress by itself.
        `compiling`: it compiles programs first, so it may take COMPILE_S until the next beat."""
        self.doing_what, self.compiling = what, compiling

    def stopping(self) -> None:
        """The loop reached the step it stops at: saving now is progress, not a stall."""
        self.stop_asked_at = None

    def limit(self) -> float:
        """Seconds without a beat after which the run counts as hung."""
        limit = self.hang_s
        if self.intervals:
            limit = max(limit, FACTOR * statistics.median(self.intervals))
        return max(limit, COMPILE_S) if self.compiling else limit

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> Watchdog:
        if threading.current_thread() is threading.main_thread():
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            self._fds = (r, w)
            self._previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self.last_beat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="jaxpar-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * POLL_S)  # it reads the signal pipe closed below
        if self._fds is not None:
            signal.set_wakeup_fd(self._previous_fd if self._previous_fd is not None else -1)
            for fd in self._fds:
                os.close(fd)
            self._fds = None

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        next_poll = 0.0
        while not self._stopped.is_set():
            self._read_signals()
            now = time.monotonic()
            if now >= next_poll:  # the coordination service and the parent: once a second
                next_poll = now + 1.0
                self._poll_notice()
                self._check_launcher()
            if self._stopped.is_set():
                return
            asked_at = self.stop_asked_at  # read once: the main thread may clear it
            if self.grace_s and asked_at is not None and now - asked_at > self.grace_s:
                self._exit(
                    f"{self.stop_name}: the run could not stop at the end of a step within "
                    f"{self.grace_s:.0f} s (--config.stop_grace_s); {self._where()}. Stopped "
                    "without saving; checkpoints already saved are kept",
                    1,
                )
            waited = now - self.last_beat
            if self.hang_s and waited > self.limit():
                self._hung(waited)

    def _read_signals(self) -> None:
        fds = self._fds
        if fds is None:
            self._stopped.wait(POLL_S)
            return
        try:
            ready, _, _ = select.select([fds[0]], [], [], POLL_S)
            data = os.read(fds[0], 64) if ready else b""
        except (OSError, ValueError):  # closed by stop() meanwhile
            return
        for signum in data:
            if signum == signal.SIGINT and self.asked:
                self._exit("interrupted: stopped at once; checkpoints already saved are kept", 130)
            if signum in (signal.SIGINT, signal.SIGTERM):
                self._ask(signal.Signals(signum).name)

    def _ask(self, name: str) -> None:
        if not self.asked:
            self.asked = True
            self.stop_asked_at, self.stop_name = time.monotonic(), name
            cluster.note_stopping(name)

    def _poll_notice(self) -> None:
        """Across processes a SIGTERM goes to JAX's own handler; its notice reaches every
        process through the coordination service, where it is read here."""
        if self.asked or not cluster.is_multiprocess():
            return
        if self._coordination is None:
            try:
                self._coordination = jax_internals.Coordination()
            except RuntimeError:  # shut down meanwhile (cluster.finish)
                return
        if self._coordination.preemption_notice():
            self._ask("preemption notice (SIGTERM)")

    def _check_launcher(self) -> None:
        if self._launcher and os.getppid() != self._launcher:
            self._exit(f"the launcher (pid {self._launcher}) is gone; this process stops too", 1)

    def _hung(self, waited: float) -> None:
        sys.stdout.flush()
        print(
            f"\njaxpar: no progress for {waited:.0f} s; the stack of every thread:", file=sys.stderr
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        self._exit(
            f"the run hung: no progress for {waited:.0f} s (limit {self.limit():.0f} s: "
            f"--config.hang_timeout_s, or {FACTOR}x the recent step time, at least {COMPILE_S} s while compiling); last done: "
            f"{self.last_what}; {self._where()}. Stacks are above; raise "
            "--config.hang_timeout_s if it was only slow",
            1,
        )

    def _where(self) -> str:
        return f"it was {self.doing_what}, in {where_main_thread_is()}"

    def _exit(self, message: str, status: int) -> None:
        if not self._stopped.is_set():
            cluster.leave(message, status)


def where_main_thread_is() -> str:
    """file:line (function) of the main thread's innermost jaxpar frame (or innermost frame)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    innermost = frame
    while frame is not None:
        if f"{os.sep}jaxpar{os.sep}" in frame.f_code.co_filename:
            break
        frame = frame.f_back
    frame = frame or innermost
    if frame is None:
        return "an unknown place"
    path = frame.f_code.co_filename
    short = path[path.rfind(f"{os.sep}jaxpar{os.sep}") + 1 :] if "jaxpar" in path else path
    return f"{short}:{frame.f_lineno} ({frame.f_code.co_name})"


def injected_hang(step: int) -> None:
    """For the tests only: sleep forever inside `step` in the process JAXPAR_TEST_HANG names."""
    spec = os.environ.get(HANG_ENV)
    if not spec:
        return
    import jax

    process, at = (int(x) for x in spec.split(":"))
    if process == jax.process_index() and step == at:
        while True:
            time.sleep(3600)
