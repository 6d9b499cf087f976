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
together and exit 0 (see preemption.Preemption).

What listens. Process 0 hosts the coordination service, a gRPC server on the coordinator's
port, which JAX binds to every interface ([::]:PORT) unless told otherwise: here it binds to
the coordinator's own address when that is a loopback one, else where
--coordinator_bind_address says, else JAX's default (`bind_address`). Every process's gloo
listens on a few ports of its own, on the address its machine's name resolves to; with a
loopback coordinator, or under a cluster (SLURM) with the service bound to a loopback address,
on that address instead (`gloo_host`). So a run on one machine (launch/local.py, the
tests) listens on loopback only. The JAX internals used here are in jaxpar.jax_internals,
checked before joining.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
import threading
import time

from jaxpar import jax_internals
from jaxpar.gloo_output import QuietGloo

DEFAULT_HEARTBEAT_S = 15  # a lost process is declared after this long without heartbeats

_CLUSTER_ENV = {  # environment variable -> launcher; set by the launcher in every process
    "OMPI_COMM_WORLD_SIZE": "Open MPI",
    "SLURM_STEP_NUM_TASKS": "SLURM (srun)",
}
_lock = threading.Lock()
_heartbeat_s = DEFAULT_HEARTBEAT_S


class ClusterError(ValueError):
    """A coordinator or bind address that cannot work (the message is one line)."""


_ADDRESS = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\s:\[\]]+)):(?P<port>\d{1,5})")


def split_address(address: str, flag: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT or [IPV6]:PORT; ClusterError naming `flag` otherwise."""
    match = _ADDRESS.fullmatch(address)
    if not match or not 0 < int(match["port"]) < 65536:
        raise ClusterError(
            f"{flag} {address!r} is not HOST:PORT with a port in 1..65535 "
            "(e.g. 10.0.0.1:12345, host0:12345, [::1]:12345)"
        )
    return match["ipv6"] or match["host"], int(match["port"])


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or IP address) is this machine's loopback: localhost, 127.0.0.0/8
    or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def bind_address(coordinator: str | None, given: str | None = None) -> str | None:
    """HOST:PORT where process 0's coordination service listens: `given` (after checking it);
    else None, JAX's own choice, where JAX_COORDINATOR_BIND_ADDRESS is set (JAX reads it); else
    the coordinator's own address when it is a loopback one, so that a run on one machine
    listens on loopback only; else None: JAX's default, every interface ([::]:PORT)."""
    host = None if coordinator in (None, "auto") else split_address(coordinator, "--coordinator")[0]
    if given:
        split_address(given, "--coordinator_bind_address")
        return given
    if os.environ.get("JAX_COORDINATOR_BIND_ADDRESS") or host is None:
        return None
    return coordinator if is_loopback(host) else None


def gloo_host(coordinator: str | None, bind: str | None = None) -> str | None:
    """The loopback host gloo listens on in a job on one machine, else None (the address this
    machine's name resolves to, gloo's default). One machine: the coordinator is a loopback
    address; or, where JAX finds the coordinator (`coordinator` None or "auto": SLURM, ...),
    its service is bound to one (`bind`, else JAX_COORDINATOR_BIND_ADDRESS), so that no other
    machine could join."""
    if coordinator not in (None, "auto"):
        host = split_address(coordinator, "--coordinator")[0]
    elif bind or os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"):
        flag = "--coordinator_bind_address" if bind else "JAX_COORDINATOR_BIND_ADDRESS"
        host = split_address(bind or os.environ["JAX_COORDINATOR_BIND_ADDRESS"], flag)[0]
    else:
        return None
    return host if is_loopback(host) else None


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
    bind: str | None = None,
) -> None:
    """Join the job's processes (before any computation); a no-op for a one-process run.
    `bind`: where process 0's coordination service listens (see `bind_address`). Raises
    ClusterError for an address that cannot work, jax_internals.JaxInternalsError for a JAX
    whose internals moved."""
    auto = coordinator == "auto" or (coordinator is None and detected_cluster())
    if not auto and num_processes <= 1:
        return
    listen = bind_address(None if auto else coordinator, bind)
    import jax

    jax_internals.check()
    global _heartbeat_s
    _heartbeat_s = heartbeat_timeout_s
    if not os.environ.get("JAXPAR_DEBUG"):
        QuietGloo.start()
    jax_internals.set_option("jax_cpu_collectives_implementation", "gloo")
    # report lost processes instead of aborting every process
    jax_internals.set_option("jax_enable_recoverability", True)
    host = gloo_host(None if auto else coordinator, bind)
    if host is not None:  # one machine: gloo on loopback too
        jax_internals.gloo_listen_on(host)
    if auto:
        jax.distributed.initialize(
            heartbeat_timeout_seconds=heartbeat_timeout_s, coordinator_bind_address=listen
        )
    else:
        jax.distributed.initialize(
            coordinator,
            num_processes,
            process_id,
            heartbeat_timeout_seconds=heartbeat_timeout_s,
            coordinator_bind_address=listen,
        )
    _Watchdog.start()


class _Watchdog:
    """Polls the coordination service for lost processes in a daemon thread."""

    stopped = threading.Event()
    stopping = ""  # why the run is stopping, once a stop was requested (jaxpar.watchdog)

    @classmethod
    def start(cls) -> None:
        threading.Thread(target=cls._run, name="jaxpar-watchdog", daemon=True).start()

    @classmethod
    def _run(cls) -> None:
        import jax

        coordination, n = jax_internals.Coordination(), jax.process_count()
        everyone = list(range(n))
        while not cls.stopped.wait(1.0):
            try:
                live = coordination.live_processes(everyone)
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
                why = (
                    f"while the run was stopping ({cls.stopping}), so it could not stop cleanly"
                    if cls.stopping
                    else "(the coordination service stopped hearing from it): it died, was "
                    "killed or hangs"
                )
                lost(
                    f"process {names} of {n} was lost {why}; process {jax.process_index()} "
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

    coordination = jax_internals.Coordination()
    coordination.wait_at_barrier("jaxpar_finish", timeout_s)
    _Watchdog.stopped.set()
    if jax.process_index() != 0:
        jax.distributed.shutdown()
        return
    everyone = list(range(jax.process_count()))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(coordination.live_processes(everyone)) > 1:
        time.sleep(0.1)


def note_stopping(reason: str) -> None:
    """A stop was requested: a process that leaves now is reported as such, not as a crash."""
    _Watchdog.stopping = reason


def is_multiprocess() -> bool:
    """Whether this process has joined a multi-process run."""
    if "jax" not in sys.modules:
        return False
    import jax

    return jax.distributed.is_initialized()


def settle(error: BaseException) -> None:
    """A collective failed because a peer process went away (gloo says "connection closed by
    peer"): give the watchdog the time to name the lost process before reporting `error`."""
    text = str(error)
    if is_multiprocess() and any(s in text for s in ("Gloo", "by peer", "Connection")):
        time.sleep(_heartbeat_s + 3)


def leave(message: str, status: int) -> None:
    """Exit now with one line, for a reason every process meets at about the same time (a hang,
    a stop request). The coordinator (process 0) hosts the coordination service, and the others
    abort with a page of C++ when it vanishes: so it leaves last, after the others or after
    `heartbeat_timeout` + 5 s."""
    if is_multiprocess():
        import jax

        if jax.process_index() == 0:
            _Watchdog.stopped.set()  # the others leaving now is expected, not a loss
            coordination = jax_internals.Coordination()
            everyone = list(range(jax.process_count()))
            deadline = time.monotonic() + _heartbeat_s + 5
            while time.monotonic() < deadline:
                try:
                    if len(coordination.live_processes(everyone)) <= 1:
                        break
                except Exception:  # noqa: BLE001 - the service is going: nothing to wait for
                    break
                time.sleep(0.2)
    lost(message, status)


def lost(message: str, status: int = 1) -> None:
    """Print one line and leave now: no exit handlers (JAX's would wait on the lost process)."""
    with _lock:
        QuietGloo.finish()
        print(f"error: {message}", file=sys.stderr, flush=True)
        os._exit(status)
