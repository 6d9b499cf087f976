"""Several processes on loopback (jax.distributed + gloo) compute what one process computes,
pipelines included, and never hang when one of them is signalled or lost.

Each run starts 2 processes x 4 simulated devices directly (as a cluster would, without the
local launcher's help), except the first test, which goes through launch/local.py.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxpar import checkpoint, trainer
from tests.util import max_rel_error, run_steps, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RTOL = 1e-5
TINY = {  # tests.util.tiny_config, as command-line overrides of configs/base.py
    "model.name": "vgg11",
    "model.width": 0.0625,
    "model.batch_norm": False,
    "global_batch_size": 16,
    "learning_rate": 0.05,
    "warmup_steps": 0,
    "lr_schedule": "constant",
    "data.name": "synthetic",
    "data.num_train": 64,
    "data.num_eval": 20,
    "log_every_steps": 1,
    "eval_every_steps": 0,
}


def _flag(key, value):
    text = str(tuple(value)).replace(" ", "") if isinstance(value, tuple) else value
    return f"--config.{key}={text}"


def start(workdir, steps, **overrides) -> list[subprocess.Popen]:
    """Start 2 training processes of 4 devices each; output in WORKDIR/../proc{i}.log."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
    }
    settings = {**TINY, "num_train_steps": steps, **overrides}
    args = ["--config", "configs/base.py", "--workdir", str(workdir)]
    args += [_flag(k, v) for k, v in settings.items()]
    procs = []
    for i in range(2):
        log = open(f"{workdir}.proc{i}.log", "a")
        cmd = [sys.executable, "-u", "-m", "jaxpar.train", *args]
        cmd += [f"--coordinator=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def wait_all(procs, timeout=300) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(deadline - time.monotonic(), 1)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return codes


def output(workdir, i) -> str:
    return open(f"{workdir}.proc{i}.log").read()


def run_two(workdir, steps, **overrides):
    """Run to completion; returns the train losses process 0 logged."""
    codes = wait_all(start(workdir, steps, **overrides))
    assert codes == [0, 0], output(workdir, 0)[-3000:] + output(workdir, 1)[-3000:]
    return train_losses(workdir)


def train_losses(workdir) -> list[float]:
    records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["split"] == "train"]


def restored(workdir, config):
    """The newest checkpoint in `workdir`, as the host canonical state, and its step."""
    s = trainer.setup(config, jax.devices())
    ckpt = checkpoint.Checkpointer(str(workdir), config, s.model, 0, 3)
    try:
        return ckpt.restore(s.strategy.host_target())
    finally:
        ckpt.close()


def assert_state_close(got, ref, rtol=RTOL):
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(ref.params), strict=True):
        scale = max(float(np.max(np.abs(b))), 1e-3)
        assert float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) / scale < rtol


def test_two_processes_match_one(tmp_path):
    steps = 3
    args = [
        "--config",
        "configs/vgg19_data.py",
        "--workdir",
        str(tmp_path),
        "--config.model.name=vgg11",
        "--config.model.width=0.0625",
        "--config.model.batch_norm=True",
        "--config.global_batch_size=16",
        f"--config.num_train_steps={steps}",
        "--config.log_every_steps=1",
        "--config.eval_every_steps=0",
        "--config.warmup_steps=0",
        "--config.lr_schedule=constant",
        "--config.data.name=synthetic",
        "--config.data.num_train=64",
        "--config.data.num_eval=20",
    ]
    proc = subprocess.run(
        [sys.executable, "launch/local.py", "--num_processes", "2", "--", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    summary = next(r for r in records if r["split"] == "summary")
    assert summary["num_devices"] == 8 and summary["mesh_shape"] == [8, 1, 1]
    # Only process 0 writes metrics, and both processes took part in each step.
    assert "[1]" in proc.stdout and len(losses) == steps

    config = tiny_config(**{"model.batch_norm": True, "mesh_shape": (8, 1, 1)})
    ref_losses, _ = run_steps(config, 8, steps)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)


# (1,2,4): the stage boundary is the process boundary; (2,2,2): every stage spans both
# processes (data across them); (1,8,1): 4 stages per process; (2,4,1): the data axis spans
# the processes, so every transfer crosses them.
# Interleaved 1F1B sends from the last stage back to the first (chunk 1 -> 2 on K=2); ZB-H1
# splits each backward into B and W.
PIPELINES = [(mesh, schedule) for mesh in [(1, 2, 4), (2, 2, 2), (1, 8, 1), (2, 4, 1)]
             for schedule in ("1f1b", "gpipe")] + [((1, 2, 4), "interleaved"),
                                                  ((2, 2, 2), "zb-h1")]  # fmt: skip
EXTRA = {"interleaved": {"pipeline.virtual_stages": 2}, "zb-h1": {"pipeline.remat": False}}


@pytest.mark.parametrize(
    "mesh,schedule", PIPELINES, ids=[f"{m}-{s}".replace(" ", "") for m, s in PIPELINES]
)
def test_pipeline_across_processes_matches_one_process(tmp_path, mesh, schedule):
    overrides = {
        "mesh_shape": mesh,
        "pipeline.schedule": schedule,
        "pipeline.num_microbatches": 2,
        "checkpoint_every_steps": 3,
        **EXTRA.get(schedule, {}),
    }
    losses = run_two(tmp_path / "run", 3, **overrides)
    config = tiny_config(**overrides)
    ref_losses, ref_state = run_steps(config, 8, 3)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    state, step = restored(tmp_path / "run", config)  # written cooperatively by both
    assert step == 3
    assert_state_close(state, ref_state)
    loss_error = float(np.max(np.abs(np.array(losses) - ref_losses) / np.abs(ref_losses)))
    print(
        f"{mesh} {schedule}: loss rel. error {loss_error:.1e}, params {max_rel_error(state.params, ref_state.params):.1e}"
    )


PIPE = {"mesh_shape": (1, 2, 4), "pipeline.schedule": "1f1b", "pipeline.num_microbatches": 2}


def test_pipeline_checkpoint_moves_between_process_counts(tmp_path):
    """A 2-process pipeline checkpoint resumes in 1 process, and the other way round; both
    end where 4 uninterrupted steps in one process do."""
    overrides = {**PIPE, "checkpoint_every_steps": 2}
    config = tiny_config(**overrides, num_train_steps=4)
    ref_losses, ref_state = run_steps(config, 8, 4)

    run_two(tmp_path / "a", 2, **overrides)  # steps 1-2 in 2 processes
    trainer.train_and_evaluate(config, str(tmp_path / "a"), jax.devices())  # 3-4 in 1
    trainer.train_and_evaluate(tiny_config(**overrides, num_train_steps=2), str(tmp_path / "b"))
    run_two(tmp_path / "b", 4, **overrides)  # steps 3-4 in 2 processes
    assert "resumed from the checkpoint of step 2" in output(tmp_path / "b", 0)
    summaries = []
    for run in ("a", "b"):
        np.testing.assert_allclose(train_losses(tmp_path / run), ref_losses, rtol=RTOL)
        records = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        summaries.append([json.loads(x) for x in records if '"summary"' in x][-1])
        state, step = restored(tmp_path / run, config)
        assert step == 4
        assert_state_close(state, ref_state)
    # The final evaluation (20 images) in 1 process ("a") and across 2 processes ("b").
    one, two = summaries
    np.testing.assert_allclose(two["eval_loss"], one["eval_loss"], rtol=RTOL)
    assert two["eval_accuracy"] == one["eval_accuracy"]


def wait_for_step(workdir, procs, step: int, timeout=240) -> None:
    deadline = time.monotonic() + timeout
    pattern = re.compile(rf"step +{step}/")
    while not pattern.search(output(workdir, 0)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), output(
            workdir, 0
        )[-3000:]
        time.sleep(0.2)


@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_process_stops_the_other_within_a_minute(tmp_path, victim):
    workdir = tmp_path / "run"
    procs = start(workdir, 5000, **PIPE)
    wait_for_step(workdir, procs, 5)
    procs[victim].kill()
    t0 = time.monotonic()
    survivor = procs[1 - victim]
    code = survivor.wait(timeout=60)  # raises if it hangs
    elapsed = time.monotonic() - t0
    text = output(workdir, 1 - victim)
    print(f"survivor exited {code} after {elapsed:.1f} s")
    assert code != 0 and elapsed < 60
    if victim == 1:  # jaxpar's watchdog: one line naming the lost process, no traceback
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert errors == [errors[0]] and "process 1 of 2 was lost" in errors[0], text[-2000:]
        assert "Traceback" not in text
    else:  # the coordinator itself: JAX's runtime stops the survivor at once
        assert "another task died" in text or "coordinator" in text, text[-2000:]


def test_sigterm_to_one_process_checkpoints_both_and_resumes_exactly(tmp_path):
    steps, overrides = 30, {**PIPE, "mesh_shape": (2, 2, 2)}
    full_losses = run_two(tmp_path / "full", steps, **overrides)
    config = tiny_config(**overrides, num_train_steps=steps)
    full_state, _ = restored(tmp_path / "full", config)

    cut = tmp_path / "cut"
    procs = start(cut, steps, **overrides)
    wait_for_step(cut, procs, 5)
    procs[1].send_signal(signal.SIGTERM)  # one process only, as a scheduler might
    assert wait_all(procs) == [0, 0]
    saved = re.search(r"saved the checkpoint of step (\d+); stopped", output(cut, 0))
    assert saved, output(cut, 0)[-2000:]
    stopped_at = int(saved.group(1))
    assert 5 <= stopped_at < steps
    _, step = restored(cut, config)  # one checkpoint, written by both
    assert step == stopped_at

    assert run_two(cut, steps, **overrides) == full_losses  # every step's loss, bit for bit
    assert f"resumed from the checkpoint of step {stopped_at}" in output(cut, 0)
    state, _ = restored(cut, config)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(full_state), strict=True):
        np.testing.assert_array_equal(a, b)


def test_cluster_launchers_are_detected(monkeypatch):
    """Under srun or mpirun with several tasks, jaxpar.train joins without --coordinator."""
    from jaxpar import cluster

    for var in ("SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert cluster.detected_cluster() is None
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")  # one task: a plain run
    assert cluster.detected_cluster() is None
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "16")
    assert cluster.detected_cluster() == "SLURM (srun)"
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert cluster.detected_cluster() == "Open MPI"
