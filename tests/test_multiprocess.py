"""Several processes on loopback (jax.distributed + gloo) compute what one process computes,
pipelines included, and never hang: when one of them is signalled, lost or stuck, every process
ends with one line.

Each run starts 2 processes x 4 simulated devices directly (as a cluster would, without the
local launcher's help), except the tests of launch/local.py itself. The runs that train to
their end (every mesh's schedules, node x data, a checkpoint moving between process counts)
run one after the other in one launch (tests/multi_jobs.py, the fixture `launch`): starting,
importing and joining once, each test checking its own runs. So do an uninterrupted run and
the run that is interrupted beside it.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxpar import checkpoint, run_setup, trainer
from tests.util import (
    MULTIPROCESS,
    ROOT,
    TINY,
    flags,
    max_rel_error,
    override,
    records,
    reference_run,
    run_and_evaluate,
    run_steps,
    start_processes,
    tiny_config,
    train_losses,
    wait_all,
    wait_in_log,
)

RTOL = 1e-5
# The main job's runs (Adam, BatchNorm) in two processes and in one are two sets of programs
# whose float rounding differs; Adam divides each gradient by its own size, so rounding in
# near-zero gradients grows by an order of magnitude a step, where the same runs under SGD
# stay within RTOL (set ADAM_RTOL to RTOL and run this file to see the difference).
ADAM_RTOL = 5e-5
# The watchdog's limit in these runs (hang_timeout_s; 300 s by default): well inside
# tests.util.wait_all's 300 s, so that a run that hangs writes every thread's stack and its
# one line to its log, which the failure shows, before the test kills it.
HANG_S = 120
# Seconds without heartbeats after which a process counts as lost (--heartbeat_timeout; 15 by
# default): shorter here, so that the tests of lost and hung processes wait less.
HEARTBEAT_S = 6


def start(workdir, steps, env=None, extra=(), **overrides) -> list[subprocess.Popen]:
    """Start the 2 processes (4 devices each) of a jaxpar.train run of tests.util.tiny_config
    with `overrides`; output in WORKDIR.proc{i}.log."""
    settings = {**TINY, "num_train_steps": steps, "hang_timeout_s": HANG_S, **overrides}
    args = ["--config", "configs/base.py", "--workdir", str(workdir), *flags(settings), *extra]
    return start_processes(workdir, args, env=env)


def start_jobs(log, jobs: dict) -> list[subprocess.Popen]:
    """Start 2 processes that run the jobs {workdir: tiny_config overrides} one after the
    other (tests/multi_jobs.py); output in LOG.proc{i}.log."""
    path = f"{log}.jobs.json"
    with open(path, "w") as f:
        json.dump(
            [
                {"workdir": str(w), "overrides": {"hang_timeout_s": HANG_S, **o}}
                for w, o in jobs.items()
            ],
            f,
        )
    return start_processes(log, [path], module="tests.multi_jobs")


def output(workdir, i) -> str:
    return open(f"{workdir}.proc{i}.log").read()


def finished(log, procs, timeout=300) -> None:
    """Both processes exited 0 within `timeout` seconds, and gloo's connection lines were
    hidden (JAXPAR_DEBUG=1 shows them)."""
    try:
        codes = wait_all(procs, timeout)
    except subprocess.TimeoutExpired:  # killed: what each process had written by then
        pytest.fail(
            f"still running after {timeout} s\n{output(log, 0)[-3000:]}{output(log, 1)[-3000:]}"
        )
    assert codes == [0, 0], output(log, 0)[-3000:] + output(log, 1)[-3000:]
    for i in range(2):
        assert "Gloo" not in output(log, i) and "peer ranks" not in output(log, i)


def run_two(workdir, steps, **overrides):
    """Run to completion; returns the train losses process 0 logged."""
    finished(workdir, start(workdir, steps, **overrides))
    return train_losses(workdir)


def assert_evaluations(got: list[dict], ref: list[dict]) -> None:
    """The same images evaluated, with the same results."""
    assert [r["count"] for r in got] == [r["count"] for r in ref]
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in ref], rtol=RTOL)
    assert [r["accuracy"] for r in got] == [r["accuracy"] for r in ref]


def restored(workdir, config):
    """The newest checkpoint in `workdir`, as the host canonical state, and its step."""
    setup = run_setup.setup(config, jax.devices())
    ckpt = checkpoint.Checkpointer(str(workdir), config, setup.model, 0, 3)
    try:
        return ckpt.restore(setup.strategy.host_target())
    finally:
        ckpt.close()


def start_local(log, *args, env=None) -> subprocess.Popen:
    """launch/local.py running 2 processes of `python -m jaxpar.train ARGS`; its output (each
    line prefixed with the process index) in the file `log`. The tests compute their
    references in this process while it runs."""
    return subprocess.Popen(
        [sys.executable, "launch/local.py", "--num_processes", "2", "--", *args],
        cwd=ROOT,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )


def finished_local(log, launcher, timeout=600) -> str:
    """The launcher's output, once it exited 0."""
    code = wait_all([launcher], timeout)[0]
    text = open(log).read()
    assert code == 0, text[-3000:]
    return text


@MULTIPROCESS
def test_the_main_job_in_two_processes_evaluates_as_one(tmp_path):
    """The README's main job (configs/vgg19_hybrid.py: (2,2,2), 1F1B over 4 micro-batches,
    BatchNorm, the embedded dataset) at a small width through launch/local.py, evaluated twice
    during training over 200 images: in two processes exactly as in one. Its summary reports
    the pipeline: the bubble (analytic and measured), the bytes between the stages, and the
    memory of each stage."""
    from configs import vgg19_hybrid

    overrides = {
        "model.width": 0.0625,
        "num_train_steps": 4,
        "eval_every_steps": 2,
        "log_every_steps": 1,
        "data.num_train": 512,
        "data.num_eval": 200,
        "checkpoint_every_steps": 0,
    }
    two = tmp_path / "two"
    log = tmp_path / "two.log"
    args = ["--config", "configs/vgg19_hybrid.py", "--workdir", str(two), *flags(overrides)]
    launcher = start_local(log, *args)
    config = override(vgg19_hybrid.get_config(), overrides)
    losses, final, evaluations = run_and_evaluate(config, 8, 4, evaluate_at=(2, 4))
    built = run_setup.setup(config)
    # One device's bytes of each stage's state (parameters, Adam's moments, the gradient
    # accumulator, BatchNorm statistics), counted from the shards one process places
    state_bytes = []
    for pairs in built.strategy.stage_states(built.strategy.place(final)):
        per_device = {}
        for shard in (sh for leaf in jax.tree.leaves(pairs) for sh in leaf.addressable_shards):
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
        state_bytes.append(max(per_device.values()))
    out = finished_local(log, launcher)
    got = records(two, "eval")
    assert [r["step"] for r in got] == [2, 4] and got[0]["count"] == 200
    assert_evaluations(got, evaluations)
    np.testing.assert_allclose(train_losses(two), losses, rtol=ADAM_RTOL)

    s = records(two, "summary")[-1]
    bounds, model = built.strategy.bounds, built.model
    assert s["strategy"] == "pipeline" and s["mesh_shape"] == [2, 2, 2]
    assert s["pipeline_schedule"] == "1f1b" and s["stage_bounds"] == list(bounds)
    assert s["analytic_bubble"] == pytest.approx(1 / (4 + 1))  # (K-1)/(M+K-1)
    # The measured bubble is the timeline of 1F1B (K=2, M=4) with the measured chunk times
    # T0, T1 (F + B per micro-batch): busy 4 (T0 + T1) over 2 stages x the makespan. By hand,
    # the makespan is at least T0 + 4 T1 (stage 0's first forward, all of stage 1, stage 0's
    # last backward) and 4 T0 (all of stage 0), and at most T0 + T1 + 3 max(T0, T1) (each
    # later micro-batch waits for the slower stage once): one value when T1 >= T0.
    t0, t1 = s["stage_time_measured_s"]
    busy = 4 * (t0 + t1)
    low, high = max(t0 + 4 * t1, 4 * t0), t0 + t1 + 3 * max(t0, t1)
    assert 1 - busy / (2 * low) - 1e-9 <= s["measured_bubble"] <= 1 - busy / (2 * high) + 1e-9
    # activations forward and their gradients back across the one boundary, whole batch
    sent = 2 * 4 * config.global_batch_size * model.layers[bounds[1] - 1].activation_size
    assert s["bytes_between_stages_per_step"] == sent
    # Memory per stage = state + the compiled programs' temporaries + stored chunk inputs.
    # The state as one process holds it; the stored inputs at 1F1B's peak (remat: each chunk
    # keeps its input until its backward): stage 0 holds 2 micro-batches of images, stage 1
    # one of the boundary activation, each 128 / 4 micro-batches / 2 replicas = 16 rows of
    # float32, whole on every tensor device.
    assert s["stage_state_bytes_per_device"] == state_bytes
    stash = [2 * 16 * 32 * 32 * 3 * 4, 1 * 16 * model.layers[bounds[1] - 1].activation_size * 4]
    assert s["peak_stash_bytes_per_device"] == stash
    temp = s["stage_program_temp_bytes"]
    assert s["memory_per_device_bytes"] == [a + b + c for a, b, c in zip(state_bytes, temp, stash)]
    assert "stage layers" in out  # the per-stage table


@MULTIPROCESS
def test_one_device_of_each_stage_per_process_trains_as_one_process(tmp_path):
    """The main job at (2, 2, 1) over 2 processes of 2 devices each: every stage is one device
    in each process, a program the CPU client runs outside its order of collectives. The
    runner waits for each such program at once (`Runner._dispatched`); without that wait the
    run hung at a step's move between stages, on 2 pool threads per process. Its losses and
    evaluations are one process's."""
    from configs import vgg19_hybrid

    overrides = {
        "mesh_shape": (2, 2, 1),
        "model.width": 0.125,
        "num_train_steps": 6,
        "eval_every_steps": 3,
        "log_every_steps": 1,
        "data.num_train": 512,
        "data.num_eval": 200,
        "checkpoint_every_steps": 0,
        "hang_timeout_s": HANG_S,
    }
    two = tmp_path / "two"
    args = ["--config", "configs/vgg19_hybrid.py", "--workdir", str(two), *flags(overrides)]
    procs = start_processes(two, args, devices=2)
    config = override(vgg19_hybrid.get_config(), overrides)
    losses, _, evaluations = run_and_evaluate(config, 4, 6, evaluate_at=(3, 6))
    finished(two, procs)
    got = records(two, "eval")
    assert [r["step"] for r in got] == [3, 6] and got[0]["count"] == 200
    assert [r["count"] for r in got] == [r["count"] for r in evaluations]
    np.testing.assert_allclose(
        [r["loss"] for r in got], [r["loss"] for r in evaluations], rtol=ADAM_RTOL
    )
    np.testing.assert_allclose(train_losses(two), losses, rtol=ADAM_RTOL)


# (1,2,4): the stage boundary is the process boundary; (2,2,2): every stage spans both
# processes (data across them); (1,8,1): 4 stages per process; (2,4,1): the data axis spans
# the processes, so every transfer crosses them.
# Interleaved 1F1B sends from the last stage back to the first (chunk 1 -> 2 on K=2); ZB-H1
# splits each backward into B and W; ZB-V's V starts and ends on process 0's stage and turns
# on process 1's (chunks 1 -> 2 on one stage), so images and labels live on one process.
# A mesh's schedules run one after the other in the same two processes. GPipe, which runs the
# stage programs 1F1B compiled in another order, crosses the processes in the SIGTERM test.
SWEEP = {
    (1, 2, 4): ("1f1b", "interleaved", "zb-v"),
    (2, 2, 2): ("1f1b", "zb-h1"),
    (1, 8, 1): ("1f1b",),
    (2, 4, 1): ("1f1b",),
}
EXTRA = {
    "interleaved": {"pipeline.virtual_stages": 2},
    "zb-h1": {"pipeline.remat": False},
    "zb-v": {"pipeline.remat": False},
}


# Evaluation at steps 2 and 3 over 7 batches of 16 (the last one padded): with 2 micro-batches
# a batch is about 10 programs and moves, so an evaluation holds several dispatch windows.
EVAL = {"data.num_eval": 100, "eval_batch_size": 16, "eval_every_steps": 2}


@pytest.fixture(scope="module")
def one_device():
    """The sweep's 3 steps on one device: losses, final state, and the evaluations after
    steps 2 and 3."""
    return run_and_evaluate(tiny_config(mesh_shape=(1, 1, 1), **EVAL), 1, 3, evaluate_at=(2, 3))


PIPE = {"mesh_shape": (1, 2, 4), "pipeline.schedule": "1f1b", "pipeline.num_microbatches": 2}
# (node, data) = (2, 4): each process is a node of 4 devices
NODE_DATA = {"mesh_axes": ("node", "data"), "mesh_shape": (2, 4), "model.batch_norm": True}
MOVE = {**PIPE, "checkpoint_every_steps": 2}  # the checkpoint that moves between counts


def sweep_jobs(root) -> dict:
    """{workdir: overrides} of the sweep: each schedule of SWEEP on its mesh."""
    return {
        root / f"{'x'.join(map(str, mesh))}-{schedule}": {
            "mesh_shape": mesh,
            "pipeline.schedule": schedule,
            "pipeline.num_microbatches": 2,
            "num_train_steps": 3,
            "checkpoint_every_steps": 3,
            **EVAL,
            **EXTRA.get(schedule, {}),
        }
        for mesh, schedules in SWEEP.items()
        for schedule in schedules
    }


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """One launch of 2 processes (tests/multi_jobs.py) for the runs that train to their end:
    the sweep, node x data, and the 2-process parts of the checkpoint that moves between
    process counts (run "a" steps 1-2, then run "b" steps 3-4, whose steps 1-2 ran in 1
    process before). One start-up, import and join for all; each test checks its own runs.
    Returns the launch's directory: LAUNCH/two.proc{i}.log, a workdir per run."""
    root = tmp_path_factory.mktemp("launch")
    trainer.train_and_evaluate(tiny_config(**MOVE, num_train_steps=2), str(root / "b"))  # 1-2 in 1
    jobs = {
        **sweep_jobs(root),
        root / "node_data": {**NODE_DATA, "num_train_steps": 3},
        root / "a": {**MOVE, "num_train_steps": 2},
        root / "b": {**MOVE, "num_train_steps": 4},
    }
    # as long as 5 minutes a job (a job that hangs ends at its watchdog's HANG_S)
    finished(root / "two", start_jobs(root / "two", jobs), timeout=300 * len(jobs))
    return root


def job_output(log, workdir) -> str:
    """What process 0 printed during the job in `workdir` of a tests/multi_jobs.py launch."""
    text = output(log, 0)
    start = text.index(f"job {workdir}\n")
    end = text.find("\njob ", start + 1)
    return text[start : end if end >= 0 else len(text)]


@MULTIPROCESS
def test_two_processes_match_one(launch):
    """Two-level data parallelism, node x data = (2, 4): each process is a node (4 devices),
    the gradient reduced inside it, across the two, and gathered back; BatchNorm on. The 3
    steps of one device."""
    steps = 3
    ref_losses, _ = reference_run(tiny_config(**NODE_DATA), steps)
    losses = train_losses(launch / "node_data")
    summary = records(launch / "node_data", "summary")[0]
    assert summary["num_devices"] == 8 and summary["mesh"] == "(node=2, data=4)"
    # what crosses the processes per device: a quarter of the gradient (an all-reduce on node)
    assert summary["collective_bytes_by_axis"]["node"] < summary["param_bytes"] / 3
    # Only process 0 writes metrics (and prints); the mesh spans both processes.
    assert len(losses) == steps
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)


@pytest.mark.parametrize("mesh", list(SWEEP), ids=[str(m).replace(" ", "") for m in SWEEP])
@MULTIPROCESS
def test_pipelines_across_processes_match_one_device(launch, one_device, mesh):
    """Each schedule of the sweep on `mesh` across 2 processes: 3 steps, the evaluations at
    steps 2 and 3, and the checkpoint both processes write, as on one device."""
    ref_losses, ref_state, ref_evaluations = one_device
    jobs = {w: o for w, o in sweep_jobs(launch).items() if o["mesh_shape"] == mesh}
    assert len(jobs) == len(SWEEP[mesh])
    for workdir, overrides in jobs.items():
        losses = train_losses(workdir)
        np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, err_msg=workdir.name)
        got = records(workdir, "eval")
        assert [r["step"] for r in got] == [2, 3], workdir.name
        assert_evaluations(got, ref_evaluations)
        state, step = restored(workdir, tiny_config(**overrides))  # written by both processes
        assert step == 3
        loss_error = float(np.max(np.abs(np.array(losses) - ref_losses) / np.abs(ref_losses)))
        params_error = max_rel_error(state.params, ref_state.params)
        print(f"{mesh} {workdir.name}: loss rel. error {loss_error:.1e}, params {params_error:.1e}")
        assert params_error < RTOL, workdir.name


@MULTIPROCESS
def test_pipeline_checkpoint_moves_between_process_counts(launch):
    """A 2-process pipeline checkpoint resumes in 1 process, and the other way round; both
    end where 4 uninterrupted steps on one device do. The launch ran both 2-process parts:
    steps 1-2 of run "a", then steps 3-4 of run "b" (whose steps 1-2 ran in 1 process)."""
    config = tiny_config(**MOVE, num_train_steps=4)
    a, b = launch / "a", launch / "b"
    assert "resumed from the checkpoint of step 2" in job_output(launch / "two", b)
    ref_losses, ref_state = run_steps(tiny_config(num_train_steps=4, mesh_shape=(1, 1, 1)), 1)
    trainer.train_and_evaluate(config, str(a), jax.devices())  # 3-4 in 1
    summaries = []
    for run in (a, b):
        np.testing.assert_allclose(train_losses(run), ref_losses, rtol=RTOL)
        summaries.append(records(run, "summary")[-1])
        state, step = restored(run, config)
        assert step == 4
        assert max_rel_error(state.params, ref_state.params) < RTOL
    # The final evaluation (20 images) in 1 process ("a") and across 2 processes ("b").
    one, two = summaries
    np.testing.assert_allclose(two["eval_loss"], one["eval_loss"], rtol=RTOL)
    assert two["eval_accuracy"] == one["eval_accuracy"]


def wait_for_step(workdir, procs, step: int, after: str = "") -> None:
    """Process 0 logged the progress line of `step` (after the line `after`, if given)."""
    wait_in_log(f"{workdir}.proc0.log", rf"^step +{step}/", procs, after=after)


@MULTIPROCESS
@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_process_stops_the_other_within_a_minute(tmp_path, victim):
    """Within --heartbeat_timeout + 2 s of the loss (the watchdog's promise), on a loaded
    machine some seconds more; always well within a minute."""
    workdir = tmp_path / "run"
    procs = start(workdir, 5000, extra=[f"--heartbeat_timeout={HEARTBEAT_S}"], **PIPE)
    wait_for_step(workdir, procs, 5)
    procs[victim].kill()
    t0 = time.monotonic()
    survivor = procs[1 - victim]
    code = survivor.wait(timeout=60)  # raises if it hangs
    elapsed = time.monotonic() - t0
    text = output(workdir, 1 - victim)
    print(f"survivor exited {code} after {elapsed:.1f} s")
    assert code != 0 and elapsed < HEARTBEAT_S + 20
    if victim == 1:  # jaxpar's watchdog: one line naming the lost process, no traceback
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert errors == [errors[0]] and "process 1 of 2 was lost" in errors[0], text[-2000:]
        assert "Traceback" not in text
    else:  # the coordinator itself: JAX's runtime stops the survivor at once
        assert "another task died" in text or "coordinator" in text, text[-2000:]


@MULTIPROCESS
def test_sigterm_to_one_process_checkpoints_both_and_resumes_exactly(tmp_path):
    """The uninterrupted run and the run that is sent SIGTERM run one after the other in the
    same two processes (tests/multi_jobs.py); the resumed run is a new jaxpar.train pair."""
    # GPipe on (2, 2, 2): the sweep above runs the other schedules across processes
    steps, overrides = 12, {**PIPE, "mesh_shape": (2, 2, 2), "pipeline.schedule": "gpipe"}
    full, cut, log = tmp_path / "full", tmp_path / "cut", tmp_path / "two"
    procs = start_jobs(
        log,
        {
            full: {**overrides, "num_train_steps": steps},
            cut: {**overrides, "num_train_steps": steps},
        },
    )
    wait_for_step(log, procs, 5, after=f"job {cut}\n")
    procs[1].send_signal(signal.SIGTERM)  # one process only, as a scheduler might
    assert wait_all(procs) == [0, 0], output(log, 0)[-3000:]
    text = output(log, 0)
    saved = re.search(r"saved the checkpoint of step (\d+); stopped", text)
    assert saved and text.index(f"job {cut}\n") < saved.start(), text[-2000:]
    stopped_at = int(saved.group(1))
    assert 5 <= stopped_at < steps
    config = tiny_config(**overrides, num_train_steps=steps)
    _, step = restored(cut, config)  # one checkpoint, written by both
    assert step == stopped_at

    full_losses = train_losses(full)
    assert len(full_losses) == steps
    assert run_two(cut, steps, **overrides) == full_losses  # every step's loss, bit for bit
    assert f"resumed from the checkpoint of step {stopped_at}" in output(cut, 0)
    state, _ = restored(cut, config)
    full_state, _ = restored(full, config)
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
    workdir, limit = tmp_path / "run", 4
    t0 = time.monotonic()
    procs = start(
        workdir,
        50,
        env={"JAXPAR_TEST_HANG": "1:3"},
        hang_timeout_s=limit,
        extra=[f"--heartbeat_timeout={HEARTBEAT_S}"],
        **PIPE,
    )
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


def start_launcher(workdir, steps, env=None, extra=(), **overrides) -> subprocess.Popen:
    """launch/local.py running 2 processes of tiny_config with `overrides`; its output (each
    line prefixed with the process index) in WORKDIR.log."""
    settings = {**TINY, "num_train_steps": steps, "hang_timeout_s": HANG_S, **overrides}
    args = ["--config", "configs/base.py", "--workdir", str(workdir), *flags(settings), *extra]
    log = open(f"{workdir}.log", "w")
    return subprocess.Popen(
        [sys.executable, "launch/local.py", "--num_processes", "2", "--", *args],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )


@MULTIPROCESS
def test_workers_die_with_a_killed_launcher(tmp_path):
    launcher = start_launcher(tmp_path / "run", 5000, **PIPE)
    try:
        wait_in_log(f"{tmp_path / 'run'}.log", r"step +3/", [launcher])
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
    log, grace_s = f"{tmp_path / 'run'}.log", 3
    launcher = start_launcher(
        tmp_path / "run",
        5000,
        env={"JAXPAR_TEST_HANG": "1:3"},
        extra=[f"--heartbeat_timeout={HEARTBEAT_S}"],
        stop_grace_s=grace_s,
        **PIPE,
    )
    try:
        wait_in_log(log, r"step +3/", [launcher])
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
    grace = f"could not stop at the end of a step within {grace_s} s"
    assert any(line.startswith("[1] error:") and grace in line for line in errors), errors
    # Process 0 either reaches its own grace limit or sees process 1 leave first.
    assert any(
        line.startswith("[0] error:") and (grace in line or "while the run was stopping" in line)
        for line in errors
    ), errors
