"""One process's part of a checkpoint does not read back: in a 2-process run, both processes
agree to fall back to the same older checkpoint (none resumes from a step the other cannot
read), say so in one line, keep the broken one aside, and end where the uninterrupted run ends,
bit for bit.

Two processes x 2 simulated devices, LeNet fully sharded over the 4 (mesh fsdp=4): every
parameter is split across both processes, so each writes its own shards of a checkpoint, in
CHECKPOINT/state/ocdbt.process_{i}/ (Orbax's OCDBT layout; a replicated state would be written
by process 0 alone). One launch runs the uninterrupted run and the first 4 steps of the broken
one (tests/multi_jobs.py); each test then continues a copy of the latter to step 6.
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxpar import checkpoint, configfile, run_setup
from tests.util import (
    MULTIPROCESS,
    ROOT,
    cli_env,
    free_port,
    records,
    start_processes,
    tiny_config,
    wait_all,
)

EVERY, CUT, STEPS = 2, 4, 6  # checkpoints at 2 and 4, then 6
SETTINGS = {
    "model.name": "lenet",
    "model.width": 0.25,
    "data.image_shape": (28, 28, 1),
    "mesh_axes": ("fsdp",),
    "mesh_shape": (4,),
    "checkpoint_every_steps": EVERY,
    "hang_timeout_s": 120,
}
DEVICES = 2  # per process


def write_jobs(log, jobs: dict) -> str:
    """JOBS.json for tests/multi_jobs.py: {workdir: steps}, each a run of SETTINGS."""
    path = f"{log}.jobs.json"
    with open(path, "w") as f:
        json.dump(
            [
                {"workdir": str(w), "overrides": {**SETTINGS, "num_train_steps": n}}
                for w, n in jobs.items()
            ],
            f,
        )
    return path


def output(log, i) -> str:
    return open(f"{log}.proc{i}.log").read()


def finished(log, procs) -> None:
    codes = wait_all(procs, timeout=240)
    assert codes == [0, 0], output(log, 0)[-3000:] + output(log, 1)[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the uninterrupted run's workdir, the first CUT steps of another: checkpoints 2 and 4)."""
    tmp = tmp_path_factory.mktemp("runs")
    full, cut, log = tmp / "full", tmp / "cut", tmp / "first"
    jobs = write_jobs(log, {full: STEPS, cut: CUT})
    finished(log, start_processes(log, [jobs], module="tests.multi_jobs", devices=DEVICES))
    assert sorted(os.listdir(cut / "checkpoints")) == ["2", "4"]
    return full, cut


def process_files(run, step: int, process: int) -> list[str]:
    """The files process `process` wrote of checkpoint `step`: its OCDBT shards and manifest."""
    folder = os.path.join(run, "checkpoints", str(step), "state", f"ocdbt.process_{process}")
    return sorted(os.path.join(r, name) for r, _, names in os.walk(folder) for name in names)


def final_state(workdir):
    """The canonical state of the newest checkpoint in `workdir`, and its step."""
    config = tiny_config(**SETTINGS, num_train_steps=STEPS)
    setup = run_setup.setup(config, jax.devices()[: 2 * DEVICES])
    with checkpoint.Checkpointer(str(workdir), config, setup.model, EVERY, 3) as ckpt:
        return ckpt.restore(setup.strategy.host_target())


def check_fell_back(log, run, full, where: str) -> None:
    """Process 0 said in one line that checkpoint 4 does not read back (`where`: in which
    processes) and that every process tries 2; both resumed from 2, the broken one is kept
    aside, and the run ends as the uninterrupted one, bit for bit."""
    text = output(log, 0)
    lines = [line for line in text.splitlines() if "read back" in line]
    assert len(lines) == 1, text[-3000:]
    assert lines[0].startswith(f"checkpoint {CUT} does not read back{where} ("), lines[0]
    assert lines[0].endswith("every process trying the checkpoint of step 2"), lines[0]
    assert f"resumed from the checkpoint of step {EVERY}" in text
    assert "Traceback" not in text + output(log, 1)
    assert sorted(os.listdir(run / "checkpoints")) == ["2", "4", "6", "unreadable-4"]
    # every step once in metrics.jsonl (the steps trained again replace the lost ones), with
    # the uninterrupted run's losses and final state, bit for bit
    assert [r["step"] for r in records(run, "train")] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in records(run, "train")] == [r["loss"] for r in records(full, "train")]
    (state, step), (ref, ref_step) = final_state(run), final_state(full)
    assert step == ref_step == STEPS
    jax.tree.map(np.testing.assert_array_equal, state, ref)


@MULTIPROCESS
def test_process_ones_files_overwritten_both_fall_back_to_the_same_step(tmp_path, runs):
    """Process 1's files of the newest checkpoint (4) overwritten on disk: both processes read
    every shard of a host state, so both fail to read it, and both take checkpoint 2."""
    full, first = runs
    run, log = tmp_path / "run", tmp_path / "resumed"
    shutil.copytree(first, run)
    mine, others = process_files(run, CUT, 1), process_files(run, CUT, 0)
    assert mine and others, "process 1 wrote no files of its own: the state is not sharded"
    kept = {path: open(path, "rb").read() for path in others}
    for path in mine:
        with open(path, "wb") as f:
            f.write(b"garbage")
    finished(
        log,
        start_processes(
            log, [write_jobs(log, {run: STEPS})], module="tests.multi_jobs", devices=DEVICES
        ),
    )
    check_fell_back(log, run, full, where="")
    aside = str(run / "checkpoints" / "unreadable-4")  # the same files, moved, not rewritten
    assert all(
        open(p.replace(str(run / "checkpoints" / "4"), aside), "rb").read() == b"garbage"
        for p in mine
    )
    assert all(
        open(p.replace(str(run / "checkpoints" / "4"), aside), "rb").read() == data
        for p, data in kept.items()
    )


def private_mounts() -> str | None:
    """Why a process cannot be given its own view of a folder here (root and unshare(1) are
    needed for a private mount namespace), or None."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return "needs root and unshare(1) to give one process a private view of the disk"
    done = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    return None if done.returncode == 0 else "unshare -m fails here (no mount namespaces)"


@MULTIPROCESS
def test_a_checkpoint_only_process_one_cannot_read_is_skipped_by_both(tmp_path, runs):
    """Process 1 alone sees garbage in place of its files of checkpoint 4 (a disk or cache only
    it sees: a bind mount in its own mount namespace), process 0 reads the checkpoint whole.
    They compare verdicts, and both take checkpoint 2; the line names process 1. (Before they
    compared, process 0 resumed alone and the two met Orbax's barriers out of step: both
    crashed on a barrier-name mismatch.)"""
    why = private_mounts()
    if why:
        pytest.skip(why)
    full, first = runs
    run, log = tmp_path / "run", tmp_path / "resumed"
    shutil.copytree(first, run)
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "manifest.ocdbt").write_bytes(b"garbage")
    hidden = os.path.join(run, "checkpoints", str(CUT), "state", "ocdbt.process_1")
    jobs = write_jobs(log, {run: STEPS})
    port = free_port()
    env = cli_env({"JAX_PLATFORMS": "cpu", "XLA_FLAGS": configfile.with_host_devices(DEVICES)})
    procs = []
    for i in range(2):
        cmd = [
            sys.executable,
            "-u",
            "-m",
            "tests.multi_jobs",
            jobs,
            f"--coordinator=127.0.0.1:{port}",
            "--num_processes=2",
            f"--process_id={i}",
        ]
        if i == 1:  # its own mount namespace, where the folder shows the garbage
            mount = f'mount --bind "{garbage}" "{hidden}" && exec "$@"'
            cmd = ["unshare", "-m", "sh", "-c", mount, "sh", *cmd]
        out = open(f"{log}.proc{i}.log", "w")
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT))
    finished(log, procs)
    check_fell_back(log, run, full, where=" in process 1 of 2")
