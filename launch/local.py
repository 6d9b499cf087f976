"""Start a multi-process jaxpar run on this machine, over loopback (jax.distributed + gloo).

Run:  python launch/local.py --num_processes 2 -- --config configs/vgg19_data.py --workdir runs/mp

Each process gets its own simulated CPU devices (host_device_count / num_processes of them),
joins the coordinator at 127.0.0.1, and reads only its share of every batch; together they
form one mesh. Output lines are prefixed with the process index. Ctrl-C or SIGTERM to the
launcher is passed on as a preemption notice: every process saves the same step and exits 0.
If a process dies, the others stop by themselves within seconds with one line saying which was
lost. On several machines, run on each (or see launch/slurm.sbatch):
  python -m jaxpar.train ... --coordinator HOST0:PORT --num_processes N --process_id I
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRACE_S = 60  # after one process failed, how long the others get to stop by themselves


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pump(proc: subprocess.Popen, index: int) -> None:
    for line in proc.stdout:
        sys.stdout.write(f"[{index}] {line}")
        sys.stdout.flush()


def launch(num_processes: int, devices_per_process: int, train_args: list[str]) -> int:
    """Run the processes to completion; return the first non-zero exit code, else 0."""
    coordinator = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}",
    }
    procs = []
    for i in range(num_processes):
        cmd = [
            sys.executable,
            "-u",
            "-m",
            "jaxpar.train",
            *train_args,
            f"--coordinator={coordinator}",
            f"--num_processes={num_processes}",
            f"--process_id={i}",
        ]
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    pumps = [threading.Thread(target=_pump, args=(p, i), daemon=True) for i, p in enumerate(procs)]
    for t in pumps:
        t.start()

    def forward(signum, frame):  # a preemption notice for the job: every process saves, stops
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    code, failed_at = 0, None
    try:
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
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                for p in remaining:
                    p.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for p in procs:
            if p.poll() is None:
                p.kill()
        for t in pumps:
            t.join(timeout=5)
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
