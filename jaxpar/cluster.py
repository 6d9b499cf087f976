"""Joining JAX's multi-process runtime, and failing readably when a process is lost.

`initialize` calls `jax.distributed.initialize`: with explicit --coordinator/--num_processes/
--process_id, or with no arguments where the environment describes the job (SLURM's srun, Open
MPI's mpirun, or `--coordinator=auto` for any cluster JAX detects, e.g. Kubernetes). CPU devices
of different processes talk through gloo; GPUs through NCCL.

A multi-process run must never hang. By default JAX's coordination service aborts every process
with a page of C++ stack when one stops sending heartbeats, and a survivor's exit handler then
waits on a shutdown barrier for the dead one. Here the service runs in JAX's recoverable mode
(`jax_enable_recoverability`: it reports lost processes instead of aborting), and a watchdog
thread asks it every second which processes are alive (`get_live_nodes`). When one is missing,
or the service itself (in process 0) is gone, the watchdog prints one line naming what was lost
and exits non-zero at once: within `heartbeat_timeout` + 2 s of the loss, even when the main
thread is stuck in a collective with the dead process. `finish` ends the watchdog at a barrier
that every process reaches after its last collective, so that a normal exit is never mistaken
for a loss.

A preemption notice (SIGTERM) to any one process reaches all of them through JAX's preemption
sync manager (`multihost_utils.reached_preemption_sync_point`): they agree on one step, save it
together and exit 0 (see the trainer's `_Preemption`).
"""

from __future__ import annotations

import os
import sys
import threading
import time

DEFAULT_HEARTBEAT_S = 15  # a lost process is declared after this long without heartbeats

_CLUSTER_ENV = {  # environment variable -> launcher; set by the launcher in every process
    "OMPI_COMM_WORLD_SIZE": "Open MPI",
    "SLURM_STEP_NUM_TASKS": "SLURM (srun)",
}
_lock = threading.Lock()
_heartbeat_s = DEFAULT_HEARTBEAT_S


def detected_cluster() -> str | None:
    """The launcher that started this process as one of several, if any."""
    for var, name in _CLUSTER_ENV.items():
        if int(os.environ.get(var, "1") or "1") > 1:
            return name
    return None


def initialize(
    coordinator: str | None,
    num_processes: int,
    process_id: int,
    heartbeat_timeout_s: int = DEFAULT_HEARTBEAT_S,
) -> None:
    """Join the job's processes (before any computation); a no-op for a one-process run."""
    auto = coordinator == "auto" or (coordinator is None and detected_cluster())
    if not auto and num_processes <= 1:
        return
    import jax

    global _heartbeat_s
    _heartbeat_s = heartbeat_timeout_s
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_recoverability", True)  # report lost processes, not abort
    if auto:
        jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_s)
    else:
        jax.distributed.initialize(
            coordinator, num_processes, process_id, heartbeat_timeout_seconds=heartbeat_timeout_s
        )
    _Watchdog.start()


class _Watchdog:
    """Polls the coordination service for lost processes in a daemon thread."""

    stopped = threading.Event()

    @classmethod
    def start(cls) -> None:
        threading.Thread(target=cls._run, name="jaxpar-watchdog", daemon=True).start()

    @classmethod
    def _run(cls) -> None:
        import jax
        from jax._src import distributed

        client, n = distributed.global_state.client, jax.process_count()
        everyone = list(range(n))
        while not cls.stopped.wait(1.0):
            try:
                live = client.get_live_nodes(everyone)
            except Exception:  # noqa: BLE001 - the service, in process 0, is unreachable
                if not cls.stopped.is_set():
                    lost(
                        f"process 0 of {n} (the coordinator) was lost: it died, was killed or "
                        f"is unreachable; process {jax.process_index()} stops too. {_RESTART}"
                    )
                return
            missing = [p for p in everyone if p not in live]
            if missing and not cls.stopped.is_set():
                names = ", ".join(str(p) for p in missing)
                lost(
                    f"process {names} of {n} was lost (the coordination service stopped hearing "
                    f"from it): it died, was killed or hangs; process {jax.process_index()} "
                    f"stops too. {_RESTART}"
                )


_RESTART = "Restart every process to resume from the last checkpoint"


def finish(timeout_s: int = 600) -> None:
    """Leave the run cleanly: wait until every process is past its last collective, stop
    watching for losses (a process that finished is not lost), and let process 0, which hosts
    the coordination service, leave last (a process whose service vanishes aborts). A no-op
    in a one-process run."""
    if not is_multiprocess():
        return
    import jax
    from jax._src import distributed

    client = distributed.global_state.client
    client.wait_at_barrier("jaxpar_finish", timeout_s * 1000)
    _Watchdog.stopped.set()
    if jax.process_index() != 0:
        jax.distributed.shutdown()
        return
    everyone = list(range(jax.process_count()))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(client.get_live_nodes(everyone)) > 1:
        time.sleep(0.1)


def is_multiprocess() -> bool:
    """Whether this process has joined a multi-process run."""
    if "jax" not in sys.modules:
        return False
    from jax._src import distributed

    return distributed.global_state.client is not None


def settle(error: BaseException) -> None:
    """A collective failed because a peer process went away (gloo says "connection closed by
    peer"): give the watchdog the time to name the lost process before reporting `error`."""
    text = str(error)
    if is_multiprocess() and any(s in text for s in ("Gloo", "by peer", "Connection")):
        time.sleep(_heartbeat_s + 3)


def lost(message: str, status: int = 1) -> None:
    """Print one line and leave now: no exit handlers (JAX's would wait on the lost process)."""
    with _lock:
        sys.stdout.flush()
        print(f"error: {message}", file=sys.stderr, flush=True)
        os._exit(status)
