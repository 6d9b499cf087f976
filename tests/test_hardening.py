"""What a new user's tries exposed: bounded dispatch on CPU, explicit cut points, divergence,
Ctrl-C, silent misconfiguration, and one-line errors. Mostly through the command line."""

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxpar import configfile, console, explain, optim, run_setup, trainer, watchdog, workdir
from jaxpar.config import ConfigError
from jaxpar.run_spec import RateRule
from tests.util import (
    PLUGIN_NOISE,
    ROOT,
    SHORT_RUN,
    cli_env,
    max_rel_error,
    one_error_line,
    records,
    reference_run,
    run_cli,
    run_steps,
    start_cli,
    tiny_config,
    wait_for_step,
)

DATA = ["--config", "configs/vgg19_data.py"]


def short_run_config(path="configs/vgg19_data.py", *args):
    """The config `python -m jaxpar.train --config PATH *SHORT_RUN *ARGS` runs."""
    overrides, _ = configfile.split_overrides([*SHORT_RUN, *args])
    return configfile.override(configfile.load(path), overrides)


# -- 1. bounded work in flight ------------------------------------------------------------


def test_many_queued_collectives_do_not_abort():
    """200 back-to-back jit(shard_map(psum)) dispatches abort XLA's CPU runtime unbounded
    (exit 134 after a 40 s rendezvous timeout); through InFlight they complete."""
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P
        from jaxpar.dispatch import InFlight
        mesh = jax.make_mesh((8,), ("data",))
        f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "data"), mesh=mesh,
                                  in_specs=P("data"), out_specs=P()))
        x = jax.device_put(jnp.ones((8, 256)), NamedSharding(mesh, P("data")))
        window = InFlight()
        outs = [window.add(f(x)) for _ in range(200)]
        print(float(jax.block_until_ready(outs)[-1][0, 0]), window.limit, window.waits)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    total, limit, waits = proc.stdout.split()
    assert float(total) == 8.0 and int(limit) == 16 and int(waits) == 200 - 16


@pytest.fixture
def cpu_load():
    """Two busy processes on the two cores while the test runs, as another job would be. A
    loaded machine is what let uncounted computations pile up past XLA's 32 per device."""
    burn = "import time\nend = time.time() + 120\nwhile time.time() < end: pass"
    procs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(2)]
    yield
    for p in procs:
        p.kill()
        p.wait()


@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 2, 2)])
def test_a_long_evaluation_under_load_stays_bounded(mesh_shape, cpu_load):
    """64 eval batches back to back on a loaded machine: far more computations than XLA's 32
    per device can queue, held back by the dispatch window, every one counted."""
    config = tiny_config(mesh_shape=mesh_shape, **{"data.num_eval": 4_096})
    config.eval_batch_size = 64
    config.pipeline.schedule, config.pipeline.num_microbatches = "1f1b", 2
    setup = run_setup.setup(config)
    state = setup.strategy.init_state(jax.random.key(0))
    result = run_setup.evaluate(setup, state)
    assert result["count"] == 4_096
    assert 0.0 <= result["accuracy"] <= 1.0 and np.isfinite(result["loss"])
    assert setup.strategy.inflight.waits > 100  # the window held the dispatch back
    if mesh_shape == (8, 1, 1):  # every computation was counted: 64 evals and 63 sums
        assert setup.strategy.inflight.position == 64 + 63


def test_pipeline_with_many_microbatches_is_bounded_and_exact():
    """K=4 stages x 16 micro-batches x 2 replicas: 132 stage programs a step, most with a
    collective over "data"; the dispatch window bounds them and the result stays exact."""
    config = tiny_config(mesh_shape=(2, 4, 1), global_batch_size=32)
    config.pipeline.schedule, config.pipeline.num_microbatches = "1f1b", 16
    losses, state = run_steps(config, 8, steps=2)
    ref_losses, ref_state = reference_run(config, steps=2)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert max_rel_error(state.params, ref_state.params) < 1e-5


# -- 2. explicit cut points -----------------------------------------------------------------


def test_cut_points_on_the_command_line(tmp_path):
    """Cut points as the command line gives them (text): the stages a run gets, and every
    mistake refused with what is wrong, in one line (checked here where the run is set up);
    then one mistake through the command line, to show that the line reaches the user."""
    mesh = "--config.mesh_shape=(4,2,1)"
    config = short_run_config("configs/vgg19_data.py", mesh, "--config.pipeline.split=(3,)")
    assert run_setup.setup(config).strategy.bounds == (0, 3, 9)  # vgg11: 9 layers
    for split, message in [
        ("(0,4)", "needs 1 cut point for 2 stages"),
        ("(40,)", "must increase strictly within 1..8"),
        ("(2,4,6)", "got 3: (2, 4, 6)"),
        ("fast", "unknown pipeline.split 'fast'"),
    ]:
        config = short_run_config("configs/vgg19_data.py", mesh, f"--config.pipeline.split={split}")
        with pytest.raises(ConfigError) as refused:
            run_setup.setup(config)
        assert message in str(refused.value) and "\n" not in str(refused.value), split
    proc = run_cli(
        *DATA, *SHORT_RUN, mesh, "--config.pipeline.split=(0,4)", "--workdir", str(tmp_path)
    )
    assert "needs 1 cut point for 2 stages" in one_error_line(proc)


def test_cut_points_in_a_config_file(tmp_path):
    path = tmp_path / "cuts.py"
    path.write_text(
        "from configs import vgg19_pipeline\n\n\ndef get_config():\n"
        "    config = vgg19_pipeline.get_config()\n"
        "    config.mesh_shape = (2, 4, 1)\n"
        "    config.pipeline.split = (2, 4, 6)\n"
        "    return config\n"
    )
    config = short_run_config(str(path), "--config.pipeline.num_microbatches=2")
    assert run_setup.setup(config).strategy.bounds == (0, 2, 4, 6, 9)
    # The file's cut points reach a run of it: with 2 stages instead of 4, they are refused.
    args = ["--config.mesh_shape=(4,2,1)", "--config.pipeline.num_microbatches=2"]
    proc = run_cli("--config", str(path), *SHORT_RUN, *args, "--workdir", str(tmp_path / "run"))
    assert "got 3: (2, 4, 6)" in one_error_line(proc)


# -- 3. divergence ----------------------------------------------------------------------------


def test_nan_stops_with_one_line_and_saves_only_finite_states(tmp_path):
    run = tmp_path / "nan"
    proc = run_cli(
        *DATA,
        *SHORT_RUN,
        "--config.num_train_steps=30",
        "--config.learning_rate=1e6",
        "--config.lr_schedule=constant",
        "--config.warmup_steps=0",
        "--config.checkpoint_every_steps=1",
        "--workdir",
        str(run),
    )
    line = one_error_line(proc, status=1)
    assert "training diverged" in line and "not finite at step" in line
    bad_step = int(line.split("not finite at step ")[1].split(";")[0])
    steps = sorted(int(p) for p in os.listdir(run / "checkpoints") if p.isdigit())
    assert steps and max(steps) < bad_step
    assert f"the last good checkpoint is step {max(steps)}" in line
    for step in steps:  # every saved state is finite
        state = ocp.PyTreeCheckpointer().restore(run / "checkpoints" / str(step) / "state")
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(state["params"]))


# -- 4. Ctrl-C --------------------------------------------------------------------------------


def _start(run, steps=400):
    args = [
        *DATA,
        *SHORT_RUN,
        f"--config.num_train_steps={steps}",
        "--config.log_every_steps=1",
        "--config.checkpoint_every_steps=5",
        "--config.eval_every_steps=0",
        "--config.schedule_steps=400",  # a shorter rerun keeps the schedule
    ]
    return start_cli(*args, "--workdir", str(run), stderr=subprocess.PIPE)


def test_ctrl_c_saves_and_resumes(tmp_path):
    run = tmp_path / "run"
    proc = _start(run)
    wait_for_step(proc, 7)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "cannot schedule" not in err
    saved = int(out.split("SIGINT: saved the checkpoint of step ")[1].split(";")[0])
    assert saved >= 7 and str(saved) in os.listdir(run / "checkpoints")
    assert not [p for p in os.listdir(run / "checkpoints") if "tmp" in p]
    proc = _start(run, steps=saved + 2)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and f"resumed from the checkpoint of step {saved}" in out


def test_second_ctrl_c_aborts_at_once(tmp_path):
    proc = _start(tmp_path / "run")
    wait_for_step(proc, 3)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 130), err  # 0 if the step ended between the two signals
    if proc.returncode == 130:
        assert err.strip().splitlines()[-1].startswith("error: interrupted")
    assert "Traceback" not in err


def test_the_hang_limit_follows_the_step_time():
    """The floor, 20x the median recent interval when that is longer, and while compiling at
    least 600 s; a compile is no step time."""
    watch = watchdog.Watchdog(hang_s=5, grace_s=1)
    assert watch.limit() == 5
    watch.intervals.extend([0.1, 1.0, 1.0, 30.0])  # a median of 1 s
    assert watch.limit() == 20
    watch.doing("compiling", compiling=True)
    assert watch.limit() == watchdog.COMPILE_S
    watch.last_beat -= 100  # a 100 s compile ends
    watch.beat("compiled")
    assert watch.limit() == 20 and list(watch.intervals) == [0.1, 1.0, 1.0, 30.0]
    assert watchdog.where_main_thread_is().startswith("jaxpar/watchdog.py:")


def test_a_hung_run_ends_with_its_stacks_and_one_line(tmp_path):
    """A test-only hook makes the run sleep inside step 3: after hang_timeout_s without a
    step, the stacks of its threads and one line, exit 1."""
    proc = run_cli(
        *DATA,
        *SHORT_RUN,
        "--config.num_train_steps=9",
        "--config.hang_timeout_s=4",
        "--config.log_every_steps=1",
        "--workdir",
        str(tmp_path),
        env={"JAXPAR_TEST_HANG": "0:3"},
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    # After 4 s, or 20x the median step time if a loaded machine made that longer.
    assert re.match(r"error: the run hung: no progress for \d+ s \(limit \d+ s", last), last
    assert "last done: step 2; it was running step 3, in jaxpar/watchdog.py" in last
    assert "Most recent call first" in proc.stderr or "most recent call first" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_second_ctrl_c_stops_a_hung_run_at_once(tmp_path):
    """The main thread sleeps inside step 3 and never returns to the loop; the first Ctrl-C
    asks for a save, the second stops the run at once all the same."""
    args = [*DATA, *SHORT_RUN, "--config.num_train_steps=9", "--config.log_every_steps=1"]
    proc = start_cli(
        *args, "--workdir", str(tmp_path), env={"JAXPAR_TEST_HANG": "0:3"}, stderr=subprocess.PIPE
    )
    wait_for_step(proc, 2)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("error: interrupted: stopped at once")


def test_ctrl_c_in_the_predictor_and_the_planner_is_one_line():
    """`python -m jaxpar.predict` and `jaxpar.plan` compile for minutes; Ctrl-C there (inside
    XLA's compiler, whose threads can crash the interpreter's shutdown) leaves at once with one
    line and status 130 (oneline.run_main, which both entry points end with)."""
    code = (
        "from jaxpar import oneline\n"
        "def main():\n    print('half a table', end='')\n    raise KeyboardInterrupt\n"
        "oneline.run_main(main, 'stopped; nothing was written')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 130 and done.stdout == "half a table"
    assert done.stderr == "error: interrupted: stopped; nothing was written\n"
    for module in ("jaxpar/predict/__main__.py", "jaxpar/plan/__main__.py"):
        text = open(os.path.join(ROOT, module), encoding="utf-8").read()
        assert "oneline.run_main(main," in text.split('if __name__ == "__main__":')[1]


# -- 5. silent misconfiguration ---------------------------------------------------------------


@pytest.mark.parametrize(
    "rules,message",
    [
        ('(("channels","tensor"),)', "tensor.rules names 'channels', which no layer uses"),
        ('(("conv_out","model"),)', "mesh axis 'model', which is not a rules axis"),
    ],
)
def test_bad_sharding_rules_are_refused(tmp_path, rules, message):
    proc = run_cli(
        *DATA,
        "--config.mesh_shape=(1,1,8)",
        f"--config.tensor.rules={rules}",
        "--workdir",
        str(tmp_path),
    )
    assert message in one_error_line(proc)


@pytest.mark.parametrize("name,expected", [("adam", -0.0002), ("sgd", -0.0002)])
def test_weight_decay(name, expected):
    """adam: decoupled (AdamW), -lr*wd*p with a zero gradient. sgd: wd*p joins the gradient
    (no momentum here, where both forms agree)."""
    config = tiny_config(**{"optimizer.name": name, "optimizer.momentum": 0.0})
    config.weight_decay, config.learning_rate = 0.1, 1e-3
    tx = optim.make_optimizer(RateRule.of_config(config))
    params = {"w": jnp.array(2.0)}
    updates, _ = tx.update({"w": jnp.array(0.0)}, tx.init(params), params)
    assert float(updates["w"]) == pytest.approx(expected, rel=1e-5)


def test_a_workdir_in_use_is_refused(tmp_path):
    with workdir.Lock(str(tmp_path)):
        proc = run_cli(*DATA, *SHORT_RUN, "--workdir", str(tmp_path))
    assert "another run (pid" in one_error_line(proc, status=1)


def test_rerun_without_checkpoints_keeps_earlier_metrics(tmp_path, capsys):
    """A rerun in a workdir whose run left no checkpoint starts again, keeping that run's
    metrics in metrics.1.jsonl, and says so (trainer.train_and_evaluate, in this process, as
    jaxpar.train calls it)."""
    args = ["--config.checkpoint_every_steps=0", "--config.eval_every_steps=0"]
    config = short_run_config("configs/vgg19_data.py", "--config.num_train_steps=2", *args)
    trainer.train_and_evaluate(config, str(tmp_path))
    first = (tmp_path / "metrics.jsonl").read_text()
    capsys.readouterr()
    trainer.train_and_evaluate(config, str(tmp_path))
    assert "metrics.1.jsonl" in capsys.readouterr().out
    assert (tmp_path / "metrics.1.jsonl").read_text() == first
    assert records(tmp_path)[-1]["split"] == "summary"


def test_a_finished_run_says_so_and_changes_nothing(tmp_path, capsys):
    """A rerun of a finished run says so and trains nothing; --eval_only evaluates its last
    checkpoint as the run did; neither writes metrics (trainer.train_and_evaluate, in this
    process, as jaxpar.train calls it)."""
    config = short_run_config("configs/vgg19_data.py", "--config.num_train_steps=2")
    trainer.train_and_evaluate(config, str(tmp_path))
    before = (tmp_path / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert trainer.train_and_evaluate(config, str(tmp_path)).finished
    out = capsys.readouterr().out
    assert "is finished" in out and "nan" not in out
    result = trainer.train_and_evaluate(config, str(tmp_path), eval_only=True)
    assert "eval of the checkpoint of step 2" in capsys.readouterr().out
    summary = records(tmp_path, "summary")[-1]  # the run's own evaluation of that state
    evaluation = result.evaluation
    assert evaluation.step == 2 and evaluation.eval_loss == pytest.approx(summary["eval_loss"])
    assert (tmp_path / "metrics.jsonl").read_text() == before


# -- 6. one line, not a traceback ----------------------------------------------------------


def test_one_line_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    cases = [
        (
            ["--config.data.name=synthetic", "--config.data.image_shape=(28,28,1)"],
            "needs inputs of at least 32x32",
        ),
        (["--config.global_batchsize=8"], 'Did you mean "global_batch_size"'),
        (["--workdir", str(tmp_path / "file")], "is a file, not a directory"),
        (["--workdir", str(tmp_path / "file" / "sub")], "is a file, not a directory"),
    ]
    for args, message in cases:
        proc = run_cli(*DATA, *SHORT_RUN, *args)
        status = 1 if "--workdir" in args else 2
        assert message in one_error_line(proc, status), args
    proc = run_cli("--config", "configs/nope.py")
    assert "config file configs/nope.py does not exist" in one_error_line(proc)
    # a Python file that is not a config (a module of tables, say)
    proc = run_cli("--config", "configs/predict/tf_cnn_benchmarks.py")
    assert one_error_line(proc).startswith(
        "error: --config configs/predict/tf_cnn_benchmarks.py has no get_config()"
    )


def test_device_count_error_names_xla_flags(tmp_path):
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    proc = run_cli("--config", f"{ROOT}/configs/vgg19_hybrid.py", cwd=tmp_path, env=env)
    assert "XLA_FLAGS already sets 4 simulated devices" in one_error_line(proc)


def _immutable(path, on: bool) -> bool:
    flag = "+i" if on else "-i"
    return subprocess.run(["chattr", flag, str(path)], check=False).returncode == 0


def test_read_only_workdir_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if not _immutable(ro, True):
        pytest.skip("chattr +i is not supported here (root ignores permissions)")
    try:
        proc = run_cli(*DATA, *SHORT_RUN, "--workdir", str(ro))
    finally:
        _immutable(ro, False)
    assert "is not writable" in one_error_line(proc, status=1)


def test_workdir_unwritable_mid_run_is_one_line(tmp_path):
    run = tmp_path / "run"
    proc = _start(run)
    wait_for_step(proc, 6)  # the checkpoint of step 5 is on its way
    if not _immutable(run / "checkpoints", True):
        proc.kill()
        pytest.skip("chattr +i is not supported here")
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        _immutable(run / "checkpoints", False)
    assert proc.returncode == 1, err[-2000:]
    lines = [ln for ln in err.strip().splitlines() if not PLUGIN_NOISE.match(ln)]
    assert len(lines) == 1 and "cannot write checkpoints to" in lines[0], err[-2000:]


# -- 7. smaller -----------------------------------------------------------------------------


def test_pmap_explain_reports_working_memory():
    """`--explain` of a pmap run reads its compiled step like any other strategy's: on every
    device the whole model's parameters and momentum (pmap replicates them), and as working
    memory the compiled step's temporaries (XLA's memory analysis of the pmap program)."""
    config = short_run_config("configs/vgg19_data.py", "--config.sync.impl=pmap")
    text = explain.explain(config)
    setup = run_setup.setup(config)
    (program,) = setup.strategy.programs(setup.strategy.batch_shapes(config.global_batch_size))
    temp = program.compiled.memory_analysis().temp_size_in_bytes

    def mib(label: str) -> float:
        line = next(x for x in text.splitlines() if x.strip().startswith(label))
        return float(re.search(r"([\d,.]+) MiB", line).group(1).replace(",", ""))

    params = setup.model.num_params * 4  # float32
    assert mib("parameters") == pytest.approx(params / 2**20, abs=0.005)
    assert mib("optimizer state") == pytest.approx(params / 2**20, abs=0.005)  # SGD momentum
    assert temp > 2**16 and mib("activations, working") == pytest.approx(temp / 2**20, abs=0.005)


def test_progress_numbers_are_readable():
    """The progress line shows each number readably: integers as they are, large values with
    one decimal and thousands separators, others with 4 decimals, tiny ones in 3 significant
    digits; text (a formatted rate) as given."""
    stream = io.StringIO()
    progress = console.Progress(400, stream=stream)
    line = progress.update(
        12, loss=2.30312, big=24.4672, rate=1234.5, small=0.05, tiny=1e-5, count=3, lr="5.00e-02"
    )
    assert stream.getvalue() == line + "\n"
    assert line.startswith("step  12/400  loss 2.3031  big 24.5  rate 1,234.5  small 0.0500")
    assert "  tiny 1e-05  count 3  lr 5.00e-02  ETA " in line
