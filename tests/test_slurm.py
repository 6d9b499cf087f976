"""launch/slurm.sbatch under a real SLURM: `sbatch` as users run it, on this machine's CPUs.

The module starts SLURM's daemons itself (munged, slurmctld, slurmd from Debian's slurm-wlm:
one node, `localhost`, 2 CPUs, every daemon on 127.0.0.1, state and logs in a temporary folder)
and stops them at the end; without them installed, or without root, it is skipped in one line.
The job runs 2 tasks of 1 CPU device each, with GPUs taken out of the script's request by
options (`--gpus-per-task=0`), and checks: the two tasks form one JAX system from SLURM's
environment alone and train as one process does; the time-limit warning (the script's
`--signal`, sent here at once with `scancel --batch --signal=USR1`) and `scontrol requeue` each
save, and the requeued job resumes at the saved step; `scancel` ends every task.
"""

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxpar import cluster, configfile
from tests.test_internals import listening
from tests.util import MULTIPROCESS, ROOT, TINY, flags, free_port, records, run_steps, tiny_config

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel")
LENET = {"model.name": "lenet", "model.width": 0.25, "data.image_shape": (28, 28, 1)}
# A learning rate low enough that the rounding in which the two processes' all-reduce differs
# from one process's (1 ulp of the loss from step ~18 at 0.05) stays below 1e-5 over the run
LR = 0.01
SETTINGS = {
    **TINY,
    **LENET,
    "learning_rate": LR,
    "mesh_shape": (2, 1, 1),
    "checkpoint_every_steps": 1000,
}
TASKS = ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-task=0"]


def missing() -> str | None:
    """Why SLURM cannot run here, or None."""
    absent = [name for name in DAEMONS + CLIENTS if not shutil.which(name)]
    if absent:
        return f"SLURM is not installed ({', '.join(absent)} absent; apt-get install slurm-wlm)"
    if os.geteuid() != 0:
        return "SLURM's daemons need root here (slurmd starts the tasks as their user)"
    return None


CONF = """\
ClusterName=jaxpartest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.socket,cred_expire=5
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


class Slurm:
    """SLURM's daemons on localhost, configured in `folder`; `run` runs a client command."""

    def __init__(self, folder):
        self.dir = str(folder)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env["SLURM_CONF"] = self.conf
        self.pid_files = []

    def start(self) -> None:
        for sub in ("state", "spool", "munge"):
            os.makedirs(os.path.join(self.dir, sub))
        munge = os.path.join(self.dir, "munge")
        key = os.path.join(munge, "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o400), "wb") as f:
            f.write(os.urandom(1024))
        with open(self.conf, "w") as f:
            f.write(CONF.format(dir=self.dir, ctld_port=free_port(), slurmd_port=free_port()))
        self._daemon(
            "munge/munged.pid",
            "munged",
            "--force",
            f"--socket={munge}/munge.socket",
            f"--key-file={key}",
            f"--pid-file={munge}/munged.pid",
            f"--log-file={munge}/munged.log",
            f"--seed-file={munge}/seed",
        )
        self._daemon("slurmctld.pid", "slurmctld", "-f", self.conf)
        self._daemon("slurmd.pid", "slurmd", "-f", self.conf, "-N", "localhost")
        deadline = time.monotonic() + 60
        while self.run("sinfo", "-h", "-o", "%T", check=False).strip() != "idle":
            assert time.monotonic() < deadline, self.logs()
            time.sleep(0.5)

    def _daemon(self, pid_file: str, *cmd: str) -> None:
        """Start a daemon (it forks into the background and writes its pid file)."""
        path = os.path.join(self.dir, pid_file)
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{cmd[0]} did not start: {done.stderr}{self.logs()}"
        self.pid_files.append(path)
        deadline = time.monotonic() + 10
        while not os.path.exists(path):
            assert time.monotonic() < deadline, f"{cmd[0]} wrote no pid file\n{self.logs()}"
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the daemons this module started, the last started first."""
        for path in reversed(self.pid_files):
            try:
                pid = int(open(path).read())
                os.kill(pid, 15)
            except (OSError, ValueError):
                continue
            deadline = time.monotonic() + 15
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.1)

    def cancel_all(self, timeout: float = 45) -> None:
        """Cancel every job left, and wait for them to end (their tasks stopped)."""
        deadline = time.monotonic() + timeout
        while (jobs := self.run("squeue", "-h", "-o", "%i", check=False).split()) and (
            time.monotonic() < deadline
        ):
            self.run("scancel", *jobs, check=False)
            time.sleep(1)

    def logs(self) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "munge/munged.log"):
            path = os.path.join(self.dir, name)
            if os.path.exists(path):
                out.append(f"--- {name}\n" + open(path).read()[-1500:])
        return "\n".join(out)

    def run(self, *cmd: str, check: bool = True) -> str:
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=False)
        assert done.returncode == 0 or not check, f"{' '.join(cmd)}: {done.stderr}"
        return done.stdout

    def job(self, job_id: str) -> dict:
        """`scontrol show job`'s fields."""
        text = self.run("scontrol", "-o", "show", "job", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    cluster = Slurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cancel_all()
        cluster.stop()


def submit(slurm: Slurm, folder, steps: int, **overrides) -> tuple[str, str, str]:
    """`sbatch launch/slurm.sbatch configs/base.py WORKDIR --config...` with 2 tasks of one CPU
    device each, from a shell in the repository with this virtual environment active; the
    coordinator port picked (JAX_COORDINATOR_PORT) and the service bound to loopback
    (JAX_COORDINATOR_BIND_ADDRESS). Returns (job id, workdir, log path)."""
    workdir, log = os.path.join(folder, "run"), os.path.join(folder, "job.log")
    port = free_port()
    env = {
        **slurm.env,
        "PATH": os.path.dirname(sys.executable) + os.pathsep + slurm.env.get("PATH", ""),
        "VIRTUAL_ENV": sys.prefix,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": configfile.with_host_devices(1),  # this process's other XLA flags
        "JAX_COORDINATOR_PORT": str(port),
        "JAX_COORDINATOR_BIND_ADDRESS": f"127.0.0.1:{port}",
    }
    settings = {**SETTINGS, "host_device_count": 1, "num_train_steps": steps, **overrides}
    cmd = [
        "sbatch",
        "--parsable",
        *TASKS,
        "--time=10",
        f"--output={log}",
        "launch/slurm.sbatch",
        "configs/base.py",
        workdir,
        *flags(settings),
    ]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0], workdir, log


def wait_for(what, predicate, slurm: Slurm, log: str, timeout: float = 120):
    """Poll `predicate()` until it is truthy; fail with the job's log after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            text = open(log).read()[-3000:] if os.path.exists(log) else "(no log)"
            pytest.fail(f"timed out waiting for {what}\n{text}\n{slurm.logs()}")
        time.sleep(0.2)
    print(f"{time.strftime('%X')} {what}")
    return value


def logged_step(log: str) -> int:
    """The newest step process 0 logged in the job's log (0 before any)."""
    if not os.path.exists(log):
        return 0
    steps = [int(s) for s in re.findall(r"^step +(\d+)/", open(log).read(), re.MULTILINE)]
    return max(steps, default=0)


def requeued(slurm: Slurm, job_id: str, log: str, restarts: int) -> None:
    """The job was requeued for the `restarts`-th time and runs again. (A requeued job waits
    for its old credential to expire, AuthInfo's cred_expire: 120 s by default, 5 here.)"""

    def running() -> bool:
        job = slurm.job(job_id)
        return job["JobState"] == "RUNNING" and job["Restarts"] == str(restarts)

    wait_for(f"requeue {restarts}", running, slurm, log)


def lines(log: str, pattern: str) -> list[str]:
    return re.findall(pattern, open(log).read(), re.MULTILINE)


@MULTIPROCESS
def test_a_job_stopped_twice_resumes_each_time_and_trains_as_one_process(slurm, tmp_path):
    """One job: the time-limit warning at step 3 or later, `scontrol requeue` a few steps after
    the resume, then to the end. Each stop saves the step it reached; each requeued start
    resumes there; the steps' losses are one process's (2 devices), every step once."""
    steps = 120
    job_id, workdir, log = submit(slurm, tmp_path, steps)
    t0 = time.monotonic()
    wait_for("step 3", lambda: logged_step(log) >= 3, slurm, log)
    slurm.run("scancel", "--batch", "--signal=USR1", job_id)  # what --signal=B:USR1@120 sends
    requeued(slurm, job_id, log, 1)
    first = int(lines(log, r"saved the checkpoint of step (\d+)")[0])
    wait_for("the resume", lambda: lines(log, r"^resumed from the checkpoint of step"), slurm, log)
    wait_for(f"step {first + 3}", lambda: logged_step(log) >= first + 3, slurm, log)
    slurm.run("scontrol", "requeue", job_id)
    requeued(slurm, job_id, log, 2)
    wait_for("the end", lambda: slurm.job(job_id)["JobState"] == "COMPLETED", slurm, log, 180)
    elapsed = time.monotonic() - t0

    text = open(log).read()
    saved = [int(s) for s in lines(log, r"saved the checkpoint of step (\d+); stopped")]
    resumed = [int(s) for s in lines(log, r"^resumed from the checkpoint of step (\d+)")]
    assert len(saved) == 2 and resumed == saved and 3 <= saved[0] < saved[1] < steps, text[-3000:]
    assert lines(log, r"^slurm\.sbatch: time limit near") and "Traceback" not in text
    # one JAX system of the two tasks (1 device each), found from SLURM's environment
    summary = records(workdir, "summary")[-1]
    assert summary["num_devices"] == 2 and summary["mesh"] == "(data=2, stage=1, tensor=1)"
    train = records(workdir, "train")
    assert [r["step"] for r in train] == list(range(1, steps + 1))
    ref, _ = run_steps(tiny_config(**LENET, learning_rate=LR, mesh_shape=(2, 1, 1)), 2, steps)
    got = np.array([r["loss"] for r in train])
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    error = np.max(np.abs(got - ref) / np.abs(ref))
    print(
        f"job {job_id}: saved at {saved}, resumed at {resumed}, {elapsed:.0f} s; loss rel. "
        f"error against one process {error:.1e}"
    )
    shutil.copy(log, os.path.join(slurm.dir, f"job-{job_id}.log"))


def job_processes(workdir: str) -> list[int]:
    """The pids of the processes whose command line names `workdir` (the job's tasks)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            python = os.path.basename(cmdline[0]).startswith(b"python")  # not srun
            if python and workdir.encode() in cmdline and b"jaxpar.train" in cmdline:
                pids.append(int(entry))
    return pids


@MULTIPROCESS
def test_scancel_ends_every_task(slurm, tmp_path):
    job_id, workdir, log = submit(slurm, tmp_path, 100_000)
    wait_for("step 2", lambda: logged_step(log) >= 2, slurm, log)
    tasks = job_processes(workdir)
    assert len(tasks) == 2, tasks
    # process 0's coordination service and both processes' gloo, on loopback only
    sockets = set().union(*(listening(pid) for pid in tasks))
    assert sockets and all(ipaddress.ip_address(ip).is_loopback for ip, _ in sockets), sockets
    slurm.run("scancel", job_id)
    wait_for("the job's end", lambda: slurm.job(job_id)["JobState"] == "CANCELLED", slurm, log)
    wait_for("every task gone", lambda: not job_processes(workdir), slurm, log, 60)
    assert lines(log, r"saved the checkpoint of step \d+; stopped"), open(log).read()[-2000:]


def test_a_loopback_bind_address_under_a_cluster_keeps_gloo_on_loopback(monkeypatch):
    """Under SLURM JAX finds the coordinator; a service bound to loopback (the flag or JAX's
    variable) means one machine, so gloo listens there too, not where the host name points."""
    monkeypatch.delenv("JAX_COORDINATOR_BIND_ADDRESS", raising=False)
    assert cluster.gloo_host(None) is None  # gloo's default: the host name's address
    assert cluster.gloo_host(None, "127.0.0.1:1234") == "127.0.0.1"
    assert cluster.gloo_host("auto", "10.0.0.1:1234") is None
    monkeypatch.setenv("JAX_COORDINATOR_BIND_ADDRESS", "[::1]:1234")
    assert cluster.gloo_host(None) == "::1"
    assert cluster.gloo_host("127.0.0.2:99") == "127.0.0.2"  # an explicit coordinator decides
    assert cluster.gloo_host("host0:99") is None
