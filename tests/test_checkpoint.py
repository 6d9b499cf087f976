"""Orbax checkpoints: exact resume after a kill, SIGTERM, restore across meshes, bad input
(an unreadable checkpoint, another model or state), and the metrics that go with a resume."""

import json
import os
import random
import signal
import types

import jax
import numpy as np
import pytest

from jaxpar import checkpoint, configfile, events, metrics, preemption, run_setup, trainer
from jaxpar import config as config_lib
from tests.util import (
    max_rel_error,
    records,
    run_steps,
    start_cli,
    tiny_config,
    train_losses,
    wait_for_step,
)

ARGS = [
    "--config",
    "configs/vgg19_data.py",
    "--config.model.name=vgg11",
    "--config.model.width=0.0625",
    "--config.global_batch_size=16",
    "--config.num_train_steps=12",
    "--config.log_every_steps=1",
    "--config.eval_every_steps=0",
    "--config.data.num_train=256",
    "--config.data.num_eval=32",
    "--config.warmup_steps=2",
    "--config.checkpoint_every_steps=2",
]


def final_params(workdir, config):
    setup = run_setup.setup(config, jax.devices())
    ckpt = checkpoint.Checkpointer(str(workdir), config, setup.model, 2, 3)
    state, step = ckpt.restore(setup.strategy.host_target())
    ckpt.close()
    return state.params, step


def start(workdir):
    return start_cli(*ARGS, "--workdir", str(workdir))


def test_kill_and_sigterm_resume_exactly(tmp_path):
    """One run of the command line stopped twice: SIGKILL at a random step, the same command
    again, SIGTERM (save and exit cleanly), the same command again. Every step's loss and the
    final parameters are those of the uninterrupted run, bit for bit (run in this process: the
    same programs on the same 8 devices, while the last command runs)."""
    # SIGKILL at a random step, then the same command again. Saves run every 2 steps and a
    # save waits for the previous one to finish, so from step 5 on a complete checkpoint
    # exists (an earlier kill would rightly restart from scratch).
    run = tmp_path / "run"
    proc = start(run)
    wait_for_step(proc, random.Random(os.getpid()).randint(5, 7))
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    # SIGTERM to the resumed run: it saves, exits cleanly, and the next run resumes there.
    proc = start(run)
    out = wait_for_step(proc, 9)
    proc.send_signal(signal.SIGTERM)
    out += proc.stdout.read()
    assert proc.wait(timeout=120) == 0, out[-2000:]
    assert "resumed from the checkpoint of step" in out
    assert "SIGTERM: saved the checkpoint of step" in out
    saved = sorted(int(d) for d in os.listdir(run / "checkpoints") if d.isdigit())
    assert saved and saved[-1] >= 9
    proc = start(run)
    overrides, rest = configfile.split_overrides(ARGS)
    config = configfile.override(configfile.load(rest[rest.index("--config") + 1]), overrides)
    ref = tmp_path / "ref"
    trainer.train_and_evaluate(config, str(ref))
    out = proc.stdout.read()
    assert proc.wait(timeout=600) == 0, out[-2000:]
    assert f"resumed from the checkpoint of step {saved[-1]}" in out

    expected = train_losses(ref)
    assert len(expected) == 12
    assert train_losses(run) == expected  # bit-identical, one line per step
    params, step = final_params(run, config)
    assert step == 12
    ref_params, _ = final_params(ref, config)
    jax.tree.map(np.testing.assert_array_equal, params, ref_params)


def cross_config(mesh_shape, steps=4):
    return tiny_config(
        **{
            "model.width": 0.125,
            "mesh_shape": mesh_shape,
            "num_train_steps": steps,
            "checkpoint_every_steps": 2,
            "pipeline.schedule": "1f1b",
            "pipeline.num_microbatches": 2,
        }
    )


@pytest.fixture(scope="module")
def one_device():
    """cross_config's 4 steps on one device: losses and final state."""
    return run_steps(cross_config((1, 1, 1)), 1, 4)


@pytest.mark.parametrize(
    "before,after,devices_after",
    [((8, 1, 1), (1, 4, 2), 8), ((2, 2, 2), (1, 1, 1), 1), ((1, 8, 1), (4, 1, 2), 8)],
)
def test_restore_across_meshes(tmp_path, capsys, one_device, before, after, devices_after):
    """Steps 1-2 on one mesh, 3-4 from its checkpoint on another: the 4 steps of one device."""
    ref_losses, ref_state = one_device
    moved = str(tmp_path / "moved")
    trainer.train_and_evaluate(cross_config(before, steps=2), moved)
    result = trainer.train_and_evaluate(cross_config(after), moved, jax.devices()[:devices_after])
    assert "resumed from the checkpoint of step 2" in capsys.readouterr().out
    losses = train_losses(moved)
    assert len(losses) == 4
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert max_rel_error(result.state.params, ref_state.params) < 1e-5


def every_five(steps):
    """A small LeNet on one device, `steps` steps, saving every 5 (quick to compile)."""
    settings = {"model.name": "lenet", "model.width": 0.25, "data.image_shape": (28, 28, 1)}
    return tiny_config(
        **settings, num_train_steps=steps, checkpoint_every_steps=5, mesh_shape=(1, 1, 1)
    )


def saved_steps(workdir) -> list[int]:
    return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())


def test_an_unreadable_newest_checkpoint_is_moved_aside_and_saving_resumes(tmp_path, capsys):
    """20 steps saved every 5, checkpoint 20's files overwritten with garbage, continued with
    num_train_steps=18, then 20 (issue 35, item 4). The fallback is one console line; 20 is
    moved to checkpoints/unreadable-20 whole; the continued runs save 18, then 20, and every
    step's loss is the uninterrupted run's, once in metrics.jsonl and once in TensorBoard."""
    run, one = str(tmp_path / "run"), jax.devices()[:1]
    trainer.train_and_evaluate(every_five(20), run, one)
    uninterrupted = train_losses(run)
    assert saved_steps(run) == [10, 15, 20]  # max_to_keep 3
    newest = tmp_path / "run" / "checkpoints" / "20"
    files = sorted(p.relative_to(newest) for p in newest.rglob("*") if p.is_file())
    for name in files:
        (newest / name).write_bytes(b"garbage")
    capsys.readouterr()

    # --eval_only writes nothing: the unreadable checkpoint is said, skipped and left in place
    result = trainer.train_and_evaluate(every_five(20), run, one, eval_only=True)
    said = [line for line in capsys.readouterr().out.splitlines() if "read back" in line]
    assert result.evaluation.step == 15 and newest.is_dir()
    assert said == [
        (
            f"checkpoint 20 in {tmp_path}/run/checkpoints does not read back (JSONDecodeError: "
            "Expecting value: line 1 column 1 (char 0)); left in place, trying the checkpoint "
            "of step 15"
        )
    ]

    trainer.train_and_evaluate(every_five(18), run, one)
    out = capsys.readouterr().out
    aside = tmp_path / "run" / "checkpoints" / "unreadable-20"
    assert [line for line in out.splitlines() if "read back" in line] == [
        (
            "checkpoint 20 does not read back (JSONDecodeError: Expecting value: line 1 column "
            f"1 (char 0)); moved it aside to {aside} (kept, not deleted), trying the checkpoint "
            "of step 15"
        )
    ]
    assert "resumed from the checkpoint of step 15" in out
    assert not newest.exists()
    assert sorted(p.relative_to(aside) for p in aside.rglob("*") if p.is_file()) == files
    assert {(aside / name).read_bytes() for name in files} == {b"garbage"}
    assert saved_steps(run) == [10, 15, 18]  # 18 is saved: nothing newer is in its way

    trainer.train_and_evaluate(every_five(20), run, one)
    out = capsys.readouterr().out
    assert "resumed from the checkpoint of step 18" in out and "read back" not in out
    assert saved_steps(run) == [15, 18, 20] and aside.is_dir()  # Orbax's clean-up passes it by
    assert train_losses(run) == uninterrupted  # bit for bit, one line per step
    assert [r["step"] for r in records(run, "train")] == list(range(1, 21))
    shown = events.read_scalars(os.path.join(run, "tensorboard"))["train/loss"]
    assert [step for step, _ in shown] == list(range(1, 21))
    np.testing.assert_array_equal([v for _, v in shown], np.float32(uninterrupted))

    # Fewer steps than the run has done: it never goes back; said, and nothing changes.
    before = open(os.path.join(run, "metrics.jsonl")).read()
    result = trainer.train_and_evaluate(every_five(12), run, one)
    out = capsys.readouterr().out
    assert result.finished
    assert "is already past step 12: its newest checkpoint is at step 20" in out
    assert saved_steps(run) == [15, 18, 20]
    assert open(os.path.join(run, "metrics.jsonl")).read() == before


def tiny_model():
    return types.SimpleNamespace(
        name="tiny",
        layers=[types.SimpleNamespace(name="dense")],
        input_shape=(4,),
        num_classes=2,
        num_params=3,
    )


def test_a_checkpoint_with_unreadable_arrays_is_moved_aside(tmp_path, capsys):
    """Only the array data of the newest checkpoint damaged (cut to half its length): its
    record reads, its arrays do not; it is moved aside and the older one restored, without
    the tracebacks TensorStore's late callbacks would print."""
    state = {"w": np.arange(3, dtype=np.float32)}
    with checkpoint.Checkpointer(str(tmp_path), tiny_config(), tiny_model(), 1, 3) as ckpt:
        for step in (1, 2):
            ckpt.save(step, {"w": state["w"] * step})
            ckpt.wait()
    for path in (tmp_path / "checkpoints" / "2" / "state").rglob("d/*"):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    capsys.readouterr()
    with checkpoint.Checkpointer(str(tmp_path), tiny_config(), tiny_model(), 1, 3) as ckpt:
        restored, step = ckpt.restore({"w": np.zeros(3, np.float32)})
    assert step == 1 and restored["w"].tolist() == [0.0, 1.0, 2.0]
    out, err = capsys.readouterr()
    said = out.splitlines()
    assert len(said) == 1 and said[0].startswith("checkpoint 2 does not read back (ValueError: ")
    assert said[0].endswith(
        f"moved it aside to {tmp_path}/checkpoints/unreadable-2 (kept, not "
        "deleted), trying the checkpoint of step 1"
    )
    assert "Traceback" not in err
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "unreadable-2"]


def test_a_checkpoint_of_another_state_is_refused_and_left_in_place(tmp_path):
    """A state of another structure (another synchronisation mode's extra entries) or shape is
    a one-line ConfigError naming what differs; the checkpoint is not moved."""
    saved = {"w": np.ones(3, np.float32), "sync": {"pending": np.zeros(3, np.float32)}}
    with checkpoint.Checkpointer(str(tmp_path), tiny_config(), tiny_model(), 1, 3) as ckpt:
        ckpt.save(1, saved)
    with checkpoint.Checkpointer(str(tmp_path), tiny_config(), tiny_model(), 1, 3) as ckpt:
        with pytest.raises(config_lib.ConfigError) as other:
            ckpt.restore({"w": np.zeros(3, np.float32), "sync": {"rate": np.zeros(())}})
        with pytest.raises(config_lib.ConfigError) as shape:
            ckpt.restore({**saved, "w": np.zeros(4, np.float32)})
    assert str(other.value) == (
        f"checkpoint 1 in {tmp_path}/checkpoints holds another state: it holds sync.pending, "
        "which this config's state lacks and lacks sync.rate, which this config's state has "
        "(written with another synchronisation mode or optimizer?); use another --workdir or "
        "the settings it was written with"
    )
    assert str(shape.value).startswith(
        f"checkpoint 1 in {tmp_path}/checkpoints holds w of shape (3,), this config's is (4,);"
    )
    assert os.listdir(tmp_path / "checkpoints") == ["1"]


def test_a_stop_says_which_step_it_saved():
    """The stop line names the step it saved, and says so when it saved nothing."""
    ckpt = types.SimpleNamespace(directory="/w/checkpoints", saved_step=7, latest_step=lambda: 7)
    with preemption.Preemption() as stop:
        stop.signal_name = "SIGTERM"
        assert stop.stopped_line(7, ckpt) == (
            "SIGTERM: saved the checkpoint of step 7; stopped. Run the same command again to "
            "resume from it in /w/checkpoints."
        )
        ckpt.saved_step, ckpt.latest_step = 5, lambda: 5
        assert stop.stopped_line(7, ckpt) == (
            "SIGTERM: stopped at step 7 without saving it; a rerun resumes from the checkpoint "
            "of step 5 in /w/checkpoints"
        )
        ckpt.saved_step, ckpt.latest_step = None, lambda: None
        assert stop.stopped_line(7, ckpt).endswith(
            "without saving it; there is no checkpoint, so a rerun starts again"
        )
        assert "checkpoints are off" in stop.stopped_line(7, None)


def test_tensorboard_drops_the_replayed_steps_as_metrics_jsonl_does(tmp_path):
    """A run killed after step 6 and resumed from the checkpoint of step 4 writes steps 5-8
    again: metrics.jsonl and TensorBoard (read back as TensorBoard reads it) hold each step
    once, with the resumed run's values. Each write is on disk when it returns, as a kill
    needs; the earlier event file is kept whole."""
    workdir, logdir = str(tmp_path), str(tmp_path / "tensorboard")
    killed = metrics.MetricWriter(workdir)
    for step in range(1, 7):
        killed.write(step, "train", loss=float(step))
    assert [s for s, _ in events.read_scalars(logdir)["train/loss"]] == [1, 2, 3, 4, 5, 6]
    killed.close()
    with metrics.MetricWriter(workdir, resume_step=4) as resumed:
        for step in range(5, 9):
            resumed.write(step, "train", loss=10.0 + step)
    expected = [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 15.0), (6, 16.0), (7, 17.0), (8, 18.0)]
    assert events.read_scalars(logdir)["train/loss"] == expected
    assert [(r["step"], r["loss"]) for r in records(workdir, "train")] == expected
    assert len(os.listdir(logdir)) == 2


def test_a_fresh_run_moves_earlier_metrics_aside_in_any_folder(tmp_path):
    """A run from step 0 over an earlier run's metrics moves metrics.jsonl and the TensorBoard
    files aside together (numbered alike), even in folders whose names end in .jsonl (only the
    file's name changes); the new curves hold the new run only."""
    workdir = tmp_path / "sweep.jsonl" / "run.jsonl"
    for run in range(3):
        with metrics.MetricWriter(str(workdir)) as writer:
            writer.write(1, "train", loss=float(run))
        moved = f"{workdir}/metrics.{run}.jsonl and {workdir}/tensorboard.{run}"
        assert writer.archived == (moved if run else None)
    assert sorted(os.listdir(tmp_path)) == ["sweep.jsonl"]
    assert sorted(os.listdir(workdir)) == [
        "metrics.1.jsonl",
        "metrics.2.jsonl",
        "metrics.jsonl",
        "tensorboard",
        "tensorboard.1",
        "tensorboard.2",
    ]
    for run, suffix in enumerate([".1", ".2", ""]):
        assert events.read_scalars(f"{workdir}/tensorboard{suffix}") == {"train/loss": [(1, run)]}
        with open(f"{workdir}/metrics{suffix}.jsonl") as f:
            assert [json.loads(line)["loss"] for line in f] == [run]


def test_incompatible_checkpoint_is_one_line_error(tmp_path):
    trainer.train_and_evaluate(cross_config((8, 1, 1)), str(tmp_path))
    wider = cross_config((8, 1, 1))
    wider.model.width = 0.25
    with pytest.raises(config_lib.ConfigError) as info:
        trainer.train_and_evaluate(wider, str(tmp_path))
    message = str(info.value)
    assert "was written for width=0.125, this config has width=0.25" in message
    assert "\n" not in message


def test_continuing_a_finished_run_keeps_its_learning_rate_schedule(tmp_path):
    """A finished 4-step cosine run continued to 6 steps: refused in one line (the rates of
    steps 5-6 would follow a stretched schedule), then run with the old schedule kept: steps
    1-4 keep their rates and steps 5-6 run at the schedule's end value."""
    settings = {"lr_schedule": "cosine", "warmup_steps": 1, "checkpoint_every_steps": 2}
    workdir = str(tmp_path / "run")
    trainer.train_and_evaluate(tiny_config(**settings, num_train_steps=4), workdir)

    def rates():
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        return {r["step"]: r["learning_rate"] for r in lines if r["split"] == "train"}

    before = rates()
    with pytest.raises(config_lib.ConfigError) as refused:
        trainer.train_and_evaluate(tiny_config(**settings, num_train_steps=6), workdir)
    message = str(refused.value)
    assert "trained on a 4-step cosine learning-rate schedule" in message
    assert "--config.schedule_steps=4" in message and "\n" not in message
    assert rates() == before  # nothing was written

    kept = tiny_config(**settings, num_train_steps=6, schedule_steps=4)
    trainer.train_and_evaluate(kept, workdir)
    after = rates()
    assert {step: after[step] for step in before} == before
    assert before[4] > 0 and after[5] == after[6] == 0.0
