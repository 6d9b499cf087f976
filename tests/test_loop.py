"""The training loop's hooks on their own: which steps they run at, the time they keep off the
clock, the divergence checks, Orbax's save decision and the stop request. Nothing here compiles
a model; the one jitted program is the finiteness check's."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
import types

import jax
import numpy as np
import pytest

from jaxpar import checkpoint, hooks, metrics, preemption, watchdog
from jaxpar.errors import TrainingError
from jaxpar.step_report import StepReport
from tests.util import tiny_config


class FakeClock:
    """time.perf_counter that moves only when told."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(hooks.time, "perf_counter", fake)
    return fake


class Records:
    """A MetricWriter that keeps what it is given."""

    def __init__(self):
        self.lines: list[dict] = []

    def write(self, step, split, **values):
        self.lines.append({"step": step, "split": split, **values})


def info(step, final=False, stopping=False, state=None) -> hooks.StepInfo:
    return hooks.StepInfo(step, state, final=final, stopping=stopping)


def watch() -> watchdog.Watchdog:
    return watchdog.Watchdog(hang_s=0, grace_s=0)  # never started: a record of beats


def step_metrics(loss: float) -> dict:
    return {"loss": np.float32(loss), "accuracy": np.float32(0.5)}


def test_hooks_run_every_n_steps_and_after_the_last():
    seen = []
    loop = hooks.Hooks()
    loop.add_hook(lambda i: seen.append(("log", i.step)), every=2)
    loop.add_hook(lambda i: seen.append(("eval", i.step)), every=0)  # only after the last
    loop.add_hook(lambda i: seen.append(("save", i.step)))
    for step in range(1, 6):
        loop.run(info(step, final=step == 5))
    assert [s for name, s in seen if name == "log"] == [2, 4, 5]
    assert [s for name, s in seen if name == "eval"] == [5]
    assert [s for name, s in seen if name == "save"] == [1, 2, 3, 4, 5]
    assert seen[-3:] == [("log", 5), ("eval", 5), ("save", 5)]  # in the order added


def test_step_times_are_one_step_behind_and_leave_out_work_off_the_clock(clock):
    timer = hooks.StepTimer(watch())
    for step, at in [(1, 100.0), (2, 101.0), (3, 103.0), (4, 106.0)]:
        clock.now = at  # when the step before `step` is found complete
        timer.dispatched(step, {"loss": np.zeros(())})
    # Step 1's end starts the clock: steps 2 and 3 took 2 s and 3 s.
    assert timer.times == [2.0, 3.0] and timer.watch.last_what == "step 3"
    with timer.off_clock():
        clock.now += 50.0  # an evaluation
    assert timer.excluded_s == 50.0
    clock.now += 1.0
    timer.dispatched(5, {})  # waits for nothing: step 4 was waited for before the evaluation
    clock.now += 4.0
    timer.dispatched(6, {})  # step 5 includes the evaluation's aftermath: not timed
    clock.now += 2.0
    timer.dispatched(7, {})
    assert timer.times == [2.0, 3.0, 2.0]


def test_log_window_writes_means_and_a_rate_without_time_off_the_clock(clock):
    timer = hooks.StepTimer(watch())
    records = Records()
    window = hooks.LogWindow(records, None, lambda i: 0.1 * i, 8, timer, ckpt=None)
    for loss in (1.0, 3.0):
        window.add(step_metrics(loss))
        clock.now += 1.0
    with timer.off_clock():
        clock.now += 30.0  # a save: not in the rate
    window.log(info(4))
    (line,) = records.lines
    assert line["step"] == 4 and line["split"] == "train"
    assert line["loss"] == pytest.approx(2.0) and line["accuracy"] == pytest.approx(0.5)
    assert line["learning_rate"] == pytest.approx(0.3)  # the rate of step 4 (index 3)
    assert line["images_per_sec"] == pytest.approx(2 * 8 / 2.0)
    assert window.last == {k: v for k, v in line.items() if k not in ("step", "split")}
    assert window.metrics == []  # a new window


def test_log_window_stops_a_diverged_run_naming_the_step():
    window = hooks.LogWindow(Records(), None, lambda i: 0.1, 8, hooks.StepTimer(watch()), None)
    for loss in (1.0, 2.0, float("nan"), 3.0):
        window.add(step_metrics(loss))
    with pytest.raises(TrainingError) as raised:
        window.log(info(8))
    message = str(raised.value)
    assert "training diverged: the loss (nan) is not finite at step 7" in message
    assert "checkpoints are off, so nothing was saved" in message and "\n" not in message


def test_the_steps_not_logged_yet_are_checked_before_a_save():
    window = hooks.LogWindow(Records(), None, lambda i: 0.1, 8, hooks.StepTimer(watch()), None)
    window.add(step_metrics(1.0))
    window.check_finite(5)
    window.add(step_metrics(float("inf")))
    with pytest.raises(TrainingError, match="the loss \\(inf\\) is not finite at step 6"):
        window.check_finite(6)


@dataclasses.dataclass
class State:
    params: dict
    batch_stats: dict


class FakeCheckpointer:
    """What the Checkpoints hook uses of checkpoint.Checkpointer, in memory."""

    directory = "/ckpt"

    def __init__(self):
        self.saved: list[int] = []

    def due(self, step, force=False):
        return step % 2 == 0 or force

    def save(self, step, state, schedule, position=None):
        self.saved.append(step)

    def wait(self):
        pass

    def latest_step(self):
        return self.saved[-1] if self.saved else None


def test_checkpoints_hook_saves_when_due_and_never_a_non_finite_state():
    timer = hooks.StepTimer(watch())
    window = hooks.LogWindow(Records(), None, lambda i: 0.1, 8, timer, None)
    ckpt = FakeCheckpointer()
    good = State({"w": jax.device_put(np.ones(3, np.float32))}, {})
    saver = hooks.Checkpoints(ckpt, lambda state: state, {}, window, timer)
    for step in (1, 2, 3):
        saver(info(step, state=good))
    saver(info(3, stopping=True, state=good))  # a stop forces a save
    assert ckpt.saved == [2, 3] and timer.watch.last_what == "the checkpoint of step 3"
    bad = State({"w": jax.device_put(np.array([1.0, np.nan], np.float32))}, {})
    with pytest.raises(TrainingError) as raised:
        saver(info(4, state=bad))
    assert "the parameters is not finite at step 4; the last good checkpoint is step 3" in str(
        raised.value
    )
    assert ckpt.saved == [2, 3]


def fake_model():
    return types.SimpleNamespace(
        name="tiny",
        layers=[types.SimpleNamespace(name="dense")],
        input_shape=(4,),
        num_classes=2,
        num_params=3,
    )


def test_orbax_decides_the_save_steps_and_a_forced_save_is_never_a_repeat(tmp_path):
    """Every 2 steps, not the first step of a fresh run (orbax 0.12.8's default policy would
    add InitialSavePolicy), and a forced save (the end, a stop) only after the newest."""
    ckpt = checkpoint.Checkpointer(str(tmp_path), tiny_config(), fake_model(), 2, 3)
    with ckpt:
        state = {"w": np.arange(3, dtype=np.float32)}
        assert [s for s in range(1, 7) if ckpt.due(s)] == [2, 4, 6]
        ckpt.save(2, state)
        ckpt.wait()
        assert not ckpt.due(2) and not ckpt.due(2, force=True)
        assert not ckpt.due(3) and ckpt.due(3, force=True) and ckpt.due(4)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
    ckpt.close()  # a second close does nothing


def test_a_failed_run_lets_the_save_in_progress_finish(tmp_path):
    ckpt = checkpoint.Checkpointer(str(tmp_path), tiny_config(), fake_model(), 1, 3)
    with pytest.raises(RuntimeError, match="boom"), ckpt:
        ckpt.save(1, {"w": np.ones(2, np.float32)})
        raise RuntimeError("boom")
    assert os.listdir(tmp_path / "checkpoints") == ["1"]


def test_ctrl_c_asks_to_stop_after_the_step_and_the_handler_is_put_back(capsys):
    before = signal.getsignal(signal.SIGINT)
    dog = watch()
    with preemption.Preemption(dog) as stop:
        assert not stop.check(1)
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not stop.asked and time.monotonic() < deadline:
            time.sleep(0.01)
        dog.stop_asked_at = 1.0  # as the watchdog's thread would have noted it
        assert stop.check(2) and stop.signal_name == "SIGINT"
        assert dog.stop_asked_at is None  # saving now is progress, not a stall
        os.kill(os.getpid(), signal.SIGINT)  # a second one: the watchdog's, not the loop's
        time.sleep(0.05)
    asked = "SIGINT: finishing this step, then saving a checkpoint and stopping (Ctrl-C again"
    said = capsys.readouterr().out.splitlines()
    assert said == [asked + " aborts at once)"]
    assert stop.stopped_line(2, saved=True).startswith("SIGINT: saved the checkpoint of step 2;")
    assert "checkpoints are off" in stop.stopped_line(2, saved=False)
    assert signal.getsignal(signal.SIGINT) is before


def test_the_summary_record():
    summary = metrics.summary(
        strategy="data",
        mesh_shape=(2, 2, 1),
        steps=10,
        global_batch_size=64,
        step_times=[9.0, 9.0, 9.0, 0.5, 0.5, 1.5],
        warmup=3,
        compile_time_s=2.0,
        wall_time_s=30.0,
        train={"loss": 1.25},
        evaluation={},
        num_params=1000,
        flops_per_example=1e9,
        report=StepReport(),
    )
    assert list(summary.as_record())[:8] == [
        "strategy",
        "partitioning",
        "num_devices",
        "mesh_shape",
        "mesh_axes",
        "mesh",
        "steps",
        "global_batch_size",
    ]
    assert summary.mesh == "(data=2, stage=2, tensor=1)"
    assert summary.num_devices == 4 and summary.throughput.timed_steps == 3
    assert summary.throughput.images_per_sec == 64 / 0.5 and summary.final_loss == 1.25
    assert math.isnan(summary.eval_loss) and math.isnan(summary.eval_accuracy)
    assert summary.model_flops_per_image == 3e9 and summary.report.pipeline_schedule is None
    assert summary.model_tflops_per_sec == pytest.approx(128 * 3e9 / 1e12)
