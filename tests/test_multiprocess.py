"""Several processes on loopback (jax.distributed + gloo) compute what one process computes,
pipelines included, and never hang: when one of them is signalled, lost or stuck, every process
ends with one line.

Each run starts 2 processes x 4 simulated devices directly (as a cluster would, without the
local launcher's help), except the tests of launch/local.py itself.
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
from tests.util import max_rel_error, override, run_steps, tiny_config

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


def MULTIPROCESS(test):
    """Every launch of several processes: in the multiprocess set, and slow."""
    return pytest.mark.slow(pytest.mark.multiprocess(test))


def _flag(key, value):
    text = str(tuple(value)).replace(" ", "") if isinstance(value, tuple) else value
    return f"--config.{key}={text}"


def start(workdir, steps, env=None, **overrides) -> list[subprocess.Popen]:
    """Start 2 training processes of 4 devices each; output in WORKDIR/../proc{i}.log."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        **(env or {}),
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
    for i in range(2):  # gloo's connection lines are hidden (JAXPAR_DEBUG=1 shows them)
        assert "Gloo" not in output(workdir, i) and "peer ranks" not in output(workdir, i)
    return train_losses(workdir)


def records(workdir, split: str) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def train_losses(workdir) -> list[float]:
    return [r["loss"] for r in records(workdir, "train")]


def assert_same_evaluations(got: list[dict], ref: list[dict]) -> None:
    """Evaluations at the same steps, of the same images, with the same results."""
    assert [(r["step"], r["count"]) for r in got] == [(r["step"], r["count"]) for r in ref]
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in ref], rtol=RTOL)
    assert [r["accuracy"] for r in got] == [r["accuracy"] for r in ref]


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


def launch_local(*args, env=None, timeout=600):
    return subprocess.run(
        [sys.executable, "launch/local.py", "--num_processes", "2", "--", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


@MULTIPROCESS
def test_two_processes_match_one(tmp_path):
    """Data parallelism over both processes, BatchNorm on, through launch/local.py."""
    steps = 3
    overrides = {**TINY, "model.batch_norm": True, "num_train_steps": steps}
    args = ["--config", "configs/vgg19_data.py", "--workdir", str(tmp_path)]
    proc = launch_local(*args, *[_flag(k, v) for k, v in overrides.items()])
    assert proc.returncode == 0, proc.stdout[-3000:]
    losses = train_losses(tmp_path)
    summary = records(tmp_path, "summary")[0]
    assert summary["num_devices"] == 8 and summary["mesh_shape"] == [8, 1, 1]
    # Only process 0 writes metrics (and prints); the mesh spans both processes.
    assert len(losses) == steps
    assert "Gloo" not in proc.stdout and "peer ranks" not in proc.stdout

    config = tiny_config(**{"model.batch_norm": True, "mesh_shape": (8, 1, 1)})
    ref_losses, _ = run_steps(config, 8, steps)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)


@MULTIPROCESS
def test_the_main_job_in_two_processes_evaluates_as_one(tmp_path):
    """The README's main job (configs/vgg19_hybrid.py: (2,2,2), 1F1B over 4 micro-batches,
    BatchNorm, the embedded dataset) at a small width, evaluated twice during training over
    200 images: in two processes exactly as in one."""
    from configs import vgg19_hybrid

    overrides = {
        "model.width": 0.0625, "num_train_steps": 4, "eval_every_steps": 2,
        "log_every_steps": 1, "data.num_train": 512, "data.num_eval": 200,
        "checkpoint_every_steps": 0,
    }  # fmt: skip
    args = ["--config", "configs/vgg19_hybrid.py", "--workdir", str(tmp_path / "two")]
    proc = launch_local(*args, *[_flag(k, v) for k, v in overrides.items()])
    assert proc.returncode == 0, proc.stdout[-3000:]
    config = override(vgg19_hybrid.get_config(), overrides)
    trainer.train_and_evaluate(config, str(tmp_path / "one"), jax.devices())
    evals = records(tmp_path / "two", "eval")
    assert [r["step"] for r in evals] == [2, 4] and evals[0]["count"] == 200
    assert_same_evaluations(evals, records(tmp_path / "one", "eval"))
    np.testing.assert_allclose(
        train_losses(tmp_path / "two"), train_losses(tmp_path / "one"), rtol=RTOL
    )


# (1,2,4): the stage boundary is the process boundary; (2,2,2): every stage spans both
# processes (data across them); (1,8,1): 4 stages per process; (2,4,1): the data axis spans
# the processes, so every transfer crosses them.
# Interleaved 1F1B sends from the last stage back to the first (chunk 1 -> 2 on K=2); ZB-H1
# splits each backward into B and W; ZB-V's V starts and ends on process 0's stage and turns
# on process 1's (chunks 1 -> 2 on one stage), so images and labels live on one process.
PIPELINES = [(mesh, schedule) for mesh in [(1, 2, 4), (2, 2, 2), (1, 8, 1), (2, 4, 1)]
             for schedule in ("1f1b", "gpipe")] + [((1, 2, 4), "interleaved"),
                                                  ((2, 2, 2), "zb-h1"), ((1, 2, 4), "zb-v")]  # fmt: skip
EXTRA = {"interleaved": {"pipeline.virtual_stages": 2}, "zb-h1": {"pipeline.remat": False},
         "zb-v": {"pipeline.remat": False}}  # fmt: skip


# Evaluation at steps 2 and 3 over 7 batches of 16 (the last one padded): with 2 micro-batches
# a batch is about 10 programs and moves, so an evaluation holds several dispatch windows.
EVAL = {"data.num_eval": 100, "eval_batch_size": 16, "eval_every_steps": 2}


@pytest.mark.parametrize(
    "mesh,schedule", PIPELINES, ids=[f"{m}-{s}".replace(" ", "") for m, s in PIPELINES]
)
@MULTIPROCESS
def test_pipeline_across_processes_matches_one_process(tmp_path, mesh, schedule):
    overrides = {
        "mesh_shape": mesh,
        "pipeline.schedule": schedule,
        "pipeline.num_microbatches": 2,
        "checkpoint_every_steps": 3,
        **EVAL,
        **EXTRA.get(schedule, {}),
    }
    losses = run_two(tmp_path / "run", 3, **overrides)
    config = tiny_config(**overrides)
    one = trainer.train_and_evaluate(config, str(tmp_path / "one"), jax.devices())
    np.testing.assert_allclose(losses, train_losses(tmp_path / "one"), rtol=RTOL)
    assert_same_evaluations(records(tmp_path / "run", "eval"), records(tmp_path / "one", "eval"))
    state, step = restored(tmp_path / "run", config)  # written cooperatively by both
    assert step == 3
    ref_state = one["state"]
    assert_state_close(state, ref_state)
    ref_losses = np.array(train_losses(tmp_path / "one"))
    loss_error = float(np.max(np.abs(np.array(losses) - ref_losses) / np.abs(ref_losses)))
    params_error = max_rel_error(state.params, ref_state.params)
    print(f"{mesh} {schedule}: loss rel. error {loss_error:.1e}, params {params_error:.1e}")


PIPE = {"mesh_shape": (1, 2, 4), "pipeline.schedule": "1f1b", "pipeline.num_microbatches": 2}


@MULTIPROCESS
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


@MULTIPROCESS
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


@MULTIPROCESS
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


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


@MULTIPROCESS
def test_a_hung_process_ends_every_process_with_one_line(tmp_path):
    """Process 1 sleeps inside step 3 (a test-only hook): both processes stop making progress;
    each prints its threads' stacks and one line, and exits 1, within the configured time."""
    workdir, limit = tmp_path / "run", 10
    t0 = time.monotonic()
    procs = start(workdir, 50, env={"JAXPAR_TEST_HANG": "1:3"}, hang_timeout_s=limit, **PIPE)
    codes = wait_all(procs, timeout=240)
    elapsed = time.monotonic() - t0
    print(f"exit codes {codes} after {elapsed:.0f} s")
    assert codes == [1, 1]
    hung = last_line(output(workdir, 1))
    assert hung.startswith("error: the run hung: no progress for") and "last done: step 2" in hung
    assert "injected_hang" in output(workdir, 1)  # the stack names where it sleeps
    # Process 0 waits in a collective for process 1: it hangs too (or sees process 1 leave).
    assert re.match(r"error: (the run hung|process 1 of 2 was lost)", last_line(output(workdir, 0)))
    assert elapsed < 150  # start-up and compile, the limit, and the coordinator leaving last


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_launcher(workdir, steps, env=None, **overrides) -> subprocess.Popen:
    settings = {**TINY, "num_train_steps": steps, **overrides}
    args = ["--config", "configs/base.py", "--workdir", str(workdir)]
    log = open(f"{workdir}.log", "w")
    return subprocess.Popen(
        [sys.executable, "launch/local.py", "--num_processes", "2", "--", *args,
         *[_flag(k, v) for k, v in settings.items()]],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
    )  # fmt: skip


def wait_for_line(path, pattern: str, proc, timeout=240) -> None:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, open(path).read()):
        assert time.monotonic() < deadline and proc.poll() is None, open(path).read()[-3000:]
        time.sleep(0.2)


@MULTIPROCESS
def test_workers_die_with_a_killed_launcher(tmp_path):
    launcher = start_launcher(tmp_path / "run", 5000, **PIPE)
    try:
        wait_for_line(f"{tmp_path / 'run'}.log", r"step +3/", launcher)
        workers = children(launcher.pid)
        assert len(workers) == 2
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 5
        while any(map(alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(alive, workers))
    finally:
        launcher.kill()


@MULTIPROCESS
def test_ctrl_c_ends_a_hung_run_after_the_grace_period(tmp_path):
    """Ctrl-C to the launcher asks every process to save at the end of the step; process 1
    never gets there (it sleeps in step 3), so after stop_grace_s both say so and exit 1."""
    log = f"{tmp_path / 'run'}.log"
    launcher = start_launcher(tmp_path / "run", 5000, env={"JAXPAR_TEST_HANG": "1:3"},
                              stop_grace_s=5, **PIPE)  # fmt: skip
    try:
        wait_for_line(log, r"step +3/", launcher)
        time.sleep(1)
        t0 = time.monotonic()
        launcher.send_signal(signal.SIGINT)
        code = launcher.wait(timeout=120)
        elapsed = time.monotonic() - t0
    finally:
        launcher.kill()
    text = open(log).read()
    print(f"launcher exited {code} after {elapsed:.0f} s")
    assert code == 1 and elapsed < 60, text[-3000:]
    errors = [line for line in text.splitlines() if "error:" in line]
    assert len(errors) == 2, text[-3000:]
    grace = "could not stop at the end of a step within 5 s"
    assert any(line.startswith("[1] error:") and grace in line for line in errors), errors
    # Process 0 either reaches its own grace limit or sees process 1 leave first.
    assert any(
        line.startswith("[0] error:") and (grace in line or "while the run was stopping" in line)
        for line in errors
    ), errors
