"""Start a multi-process jaxpar run on this machine, over loopback (jax.distributed + gloo).

Run:  python launch/local.py --num_processes 2 -- --config configs/vgg19_data.py --workdir runs/mp

Each process gets its own simulated CPU devices (host_device_count / num_processes of them),
joins the coordinator at 127.0.0.1, and reads only its share of every batch; together they
form one mesh. Everything listens on loopback only: process 0's coordination service is bound
to 127.0.0.1 (--coordinator_bind_address; JAX's default would be every interface), and gloo's
sockets are on the coordinator's address. Output lines are prefixed with the process index. Ctrl-C or SIGTERM to the
launcher is passed on as a preemption notice: every process saves the same step and exits 0
(a process that cannot reach a step boundary within --config.stop_grace_s says so in one line
and exits 1). A second Ctrl-C stops every process at once. If a process dies, the others stop
by themselves within seconds with one line saying which was lost. The processes die with the
launcher: if it is killed (even with SIGKILL), the kernel ends them (PR_SET_PDEATHSIG), and
each one also checks that its launcher is alive. On several machines, run on each (or see
launch/slurm.sbatch):
  python -m jaxpar.train ... --coordinator HOST0:PORT --num_processes N --process_id I
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from jaxpar import configfile  # imports no JAX

GRACE_S = 60  # after one process failed, how long the others get to stop by themselves
STOP_BACKSTOP_S = 600  # after a stop request, when any process still running is killed
PR_SET_PDEATHSIG = 1  # prctl(2): a signal this process gets when its parent dies


def _die_with_parent() -> None:
    """In the child before exec: the kernel sends SIGKILL when the launcher dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the worker's own check remains
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pump(proc: subprocess.Popen, index: int) -> None:
    for line in proc.stdout:
        sys.stdout.write(f"[{index}] {line}")
        sys.stdout.flush()


def worker_commands(num_processes: int, train_args: list[str], port: int) -> list[list[str]]:
    """The command line of every process: jaxpar.train joined to the coordinator at
    127.0.0.1:PORT, whose service listens there only (loopback, not the network)."""
    coordinator = f"127.0.0.1:{port}"
    joined = [f"--coordinator={coordinator}", f"--coordinator_bind_address={coordinator}"]
    return [
        [
            sys.executable,
            "-u",
            "-m",
            "jaxpar.train",
            *train_args,
            *joined,
            f"--num_processes={num_processes}",
            f"--process_id={i}",
        ]
        for i in range(num_processes)
    ]


def launch(num_processes: int, devices_per_process: int, train_args: list[str]) -> int:
    """Run the processes to completion; return the first non-zero exit code, else 0."""
    procs = _start(num_processes, devices_per_process, train_args)
    pumps = [threading.Thread(target=_pump, args=(p, i), daemon=True) for i, p in enumerate(procs)]
    for t in pumps:
        t.start()
    asked: list[float] = []  # when a stop was first asked for
    forward = _forwarder(procs, asked)
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _wait(procs, asked)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for p in procs:
            if p.poll() is None:
                p.kill()
        for t in pumps:
            t.join(timeout=5)


def _start(num_processes: int, devices_per_process: int, train_args: list[str]) -> list:
    """Start the workers, each in its own session, their output piped to the launcher."""
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": configfile.with_host_devices(devices_per_process),  # and the caller's
        "JAXPAR_LAUNCHER_PID": str(os.getpid()),  # the workers' check (jaxpar.watchdog)
    }
    procs = []
    for cmd in worker_commands(num_processes, train_args, free_port()):
        # Own session: a terminal's Ctrl-C reaches the launcher only. preexec_fn is safe here:
        # the output threads start after every process has started.
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509
            start_new_session=True,
        )
        procs.append(proc)
    return procs


def _forwarder(procs: list, asked: list[float]):
    """The launcher's SIGTERM/SIGINT handler, which passes a stop on to the workers."""

    def forward(signum, frame):
        """First Ctrl-C or SIGTERM: a preemption notice (save, stop). Then Ctrl-C: stop now."""
        now_ = signal.SIGINT if asked and signum == signal.SIGINT else signal.SIGTERM
        asked.append(time.monotonic())
        # A worker stops at once on a Ctrl-C after a stop request; two Ctrl-Cs make sure of it
        # even if it has not yet read the first request (signals of one kind do not queue).
        for _ in range(2 if now_ == signal.SIGINT else 1):
            for p in procs:
                if p.poll() is None:
                    p.send_signal(now_)
            time.sleep(0.2)
        if now_ == signal.SIGINT:  # the workers print their one line and exit at once
            return
        print(
            "launcher: asked every process to save and stop (Ctrl-C again stops at once)",
            file=sys.stderr,
            flush=True,
        )

    return forward


def _wait(procs: list, asked: list[float]) -> int:
    """Wait for every worker; the first non-zero exit code, else 0. The rest are killed
    GRACE_S after a failure, or STOP_BACKSTOP_S after a stop was asked for."""
    code, failed_at = 0, None
    remaining = list(procs)
    while remaining:
        for p in list(remaining):
            try:
                rc = p.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
            remaining.remove(p)
            if rc and not code:
                code, failed_at = rc, time.monotonic()
        # The others notice a lost process by themselves (jaxpar.cluster) and stop within
        # seconds; anything still running a minute later is stopped here.
        late = failed_at is not None and time.monotonic() - failed_at > GRACE_S
        if late or (asked and time.monotonic() - asked[0] > STOP_BACKSTOP_S):
            for p in remaining:
                p.kill()
    return code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=8, help="simulated devices in total")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then jaxpar.train flags")
    args = parser.parse_args()
    train_args = [a for a in args.train_args if a != "--"]
    if args.devices % args.num_processes:
        parser.error(f"--devices {args.devices} must be divisible by --num_processes")
    sys.exit(launch(args.num_processes, args.devices // args.num_processes, train_args))


if __name__ == "__main__":
    main()
