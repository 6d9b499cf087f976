"""The goodput schedule: the choice and the step-time model on given figures, the schedule
simulated over a growing noise scale, the candidates a config allows, and a scheduled run's
moves equal to a run stopped and restarted by hand at each of them."""

import pytest

from jaxpar import batch_schedule, metrics, preemption, trainer
from jaxpar.errors import ConfigError
from jaxpar.target import goodput
from jaxpar.target.steps import TracePoint, steps_along
from tests.util import tiny_config

MESH = (8, 1, 1)


def setup(batch: int, mesh=MESH, accum: int = 1) -> goodput.Setup:
    return goodput.Setup(batch, mesh, accum)


def test_the_choice_is_the_most_progress_per_second():
    """B0 64, B_noise 64: gains 16: 0.4, 64: 1, 256: 1.6. With step times 10, 20 and 40 ms the
    rates are 40, 50 and 40 steps of progress per second: 64 wins; at 25 ms for 256, 256."""
    times = goodput.StepTimes()
    for batch, ms in ((16, 10), (64, 20), (256, 40)):
        times.record(setup(batch), [ms / 1e3] * 3)
    choice = goodput.choose([setup(16), setup(64), setup(256)], times, 64, 64.0)
    assert choice.best == setup(64)
    assert choice.rates[setup(16)] == pytest.approx(40.0)
    assert choice.rates[setup(256)] == pytest.approx(40.0)
    times.record(setup(256), [0.025])
    assert goodput.choose([setup(16), setup(64), setup(256)], times, 64, 64.0).best == setup(256)


def test_setups_not_run_are_fitted_or_tried_one_neighbour_at_a_time():
    times = goodput.StepTimes()
    times.record(setup(64), [0.03, 0.02, 0.5])  # the median: one slow step does not count
    assert times.of(setup(64)) == pytest.approx(0.03)
    batches = [setup(b) for b in (16, 32, 64, 128, 256)]
    other = setup(64, (2, 1, 4))
    estimate = lambda s: times.estimate(s, [*batches, other, setup(128, (2, 1, 4))], setup(64))
    # one batch run: its neighbours are tried, optimistically (proportional below, the same
    # time above); the rest wait; another mesh is tried at the current batch
    assert times.of(setup(128)) is None
    assert estimate(setup(128)) == (pytest.approx(0.03), "to try")
    assert estimate(setup(32)) == (pytest.approx(0.015), "to try")
    assert estimate(setup(256)) is None and estimate(setup(16)) is None
    assert estimate(other) == (pytest.approx(0.0297), "to try")
    assert estimate(setup(128, (2, 1, 4))) is None
    # two batches: 12 ms at 16 and 30 ms at 64 fit 6 ms + 0.375 ms an image
    times.record(setup(16), [0.012])
    assert times.of(setup(256)) == pytest.approx(0.006 + 0.000375 * 256)
    assert estimate(setup(128)) == (pytest.approx(0.054), "fitted")
    assert estimate(setup(256)) is None  # not next to a batch run yet
    assert estimate(setup(16)) == (0.012, "measured")


def test_a_simulated_schedule_grows_the_batch_with_the_noise():
    """Step time 5 ms + 0.05 ms an image, B_noise rising from 20 to 2,000 over a 300-step
    reference: the schedule starts small and ends large, and takes less time than any fixed
    batch; a fixed batch takes the steps model's steps exactly."""
    candidates = [setup(b) for b in (16, 64, 256, 1024)]
    step_s = lambda s: 0.005 + 0.00005 * s.batch
    trace = [TracePoint(t, 20.0 * 100 ** (t / 300)) for t in range(1, 301)]
    schedule = goodput.simulate(trace, 64, step_s, candidates, every=10)
    batches = [s.batch for _, s in schedule.phases]
    assert batches == sorted(batches) and batches[0] < 256 and batches[-1] >= 256
    fixed = [goodput.simulate(trace, 64, step_s, fixed=c) for c in candidates]
    assert schedule.seconds < min(f.seconds for f in fixed)
    for c, f in zip(candidates, fixed, strict=True):
        assert f.steps == pytest.approx(steps_along(trace, c.batch, 64))
        assert f.seconds == pytest.approx(f.steps * step_s(c))
    # at a constant noise scale the steps are the progress over the gain
    flat = goodput.simulate([TracePoint(t, 64.0) for t in range(100)], 64, step_s, fixed=setup(256))
    assert flat.steps == pytest.approx(100 / 1.6)


def goodput_config(**overrides):
    return tiny_config(
        **{
            "lr_adaptation": "adascale",
            "lr_base_batch_size": 8,
            "batch_schedule": "goodput",
            "goodput.every_steps": 4,
            "log_every_steps": 2,
            "mesh_shape": MESH,
            **overrides,
        }
    )


def test_the_candidates_are_the_batches_each_mesh_can_run():
    config = goodput_config(
        **{
            "mesh_schedule": "goodput",
            "goodput.meshes": ((8, 1, 1), (2, 2, 2)),
            "goodput.batches": (4, 8, 16, 64),
            "goodput.max_device_rows": 2,
            "pipeline.num_microbatches": 2,
        }
    )
    found = batch_schedule.candidates(config, 8)
    # data 8: 4 does not divide by 8 replicas; 16 = 2 rows a device; 64 = 8 rows in 4 slices.
    # (2,2,2): 2 micro-batches of at most 2 rows a replica: up to batch 8.
    assert found == [
        setup(8),
        setup(16),
        setup(64, accum=4),
        setup(4, (2, 2, 2)),
        setup(8, (2, 2, 2)),
    ]


@pytest.mark.parametrize(
    "overrides,says",
    [
        ({"lr_adaptation": "none"}, "add --config.lr_adaptation=adascale"),
        ({"goodput.every_steps": 3}, "multiple of log_every_steps"),
        ({"mesh_schedule": "goodput"}, "name two or more"),
        ({"batch_schedule": "adaptive"}, "unknown batch_schedule 'adaptive'"),
    ],
)
def test_refusals(overrides, says):
    with pytest.raises(ConfigError) as e:
        batch_schedule.check(goodput_config(**overrides))
    assert says in str(e.value)


SCRIPT = {4: setup(16), 8: setup(16, (2, 1, 4)), 12: setup(8)}  # after step: move there


@pytest.fixture
def scripted(monkeypatch):
    """The schedule's decisions from SCRIPT: the mechanics of a move are under test, not the
    measured step times that would choose it."""

    def decide(self, step, noise_scale, step_times):
        best = SCRIPT.get(step, self.current)
        return goodput.Choice(best, noise_scale, {best: 1.0}, {best: 1.0})

    monkeypatch.setattr(batch_schedule.Schedule, "decide", decide)


def stop_after(monkeypatch, step: int):
    """A stop request (as SIGTERM would make) after `step`: saved there, then the run ends."""
    monkeypatch.setattr(preemption.Preemption, "check", lambda self, s: s == step)


def losses(workdir) -> list[float]:
    return [r["loss"] for r in metrics.records(str(workdir), "train")]


def test_a_scheduled_run_equals_runs_restarted_by_hand_at_each_move(
    tmp_path, monkeypatch, scripted
):
    """Moves after steps 4 (batch 8 -> 16), 8 (onto data 2 x tensor 4) and 12 (back to
    batch 8 on data 8): every step's loss is that of four runs stopped and restarted with
    those settings by hand, and a scheduled run stopped between moves resumes on the
    setup it was on and follows the rest of the schedule."""
    budget = {"num_train_steps": 24, "checkpoint_every_steps": 100, "log_every_steps": 1}
    config = goodput_config(global_batch_size=8, **budget)
    scheduled = trainer.train_and_evaluate(config, str(tmp_path / "scheduled")).summary
    assert [p[1] for p in scheduled.schedule.schedule_phases] == [
        "batch 8 on (8,1,1)",
        "batch 16 on (8,1,1)",
        "batch 16 on (2,1,4)",
        "batch 8 on (8,1,1)",
    ]
    want = losses(tmp_path / "scheduled")
    assert len(want) == scheduled.steps > 12

    resumed = str(tmp_path / "resumed")
    with monkeypatch.context() as patch:
        stop_after(patch, 10)  # inside the third phase
        trainer.train_and_evaluate(config, resumed)
    summary = trainer.train_and_evaluate(config, resumed).summary
    assert losses(resumed) == pytest.approx(want, rel=1e-6)
    assert summary.schedule.schedule_phases == scheduled.schedule.schedule_phases

    by_hand = str(tmp_path / "by_hand")
    phases = [(8, MESH, 4), (16, MESH, 8), (16, (2, 1, 4), 12), (8, MESH, None)]
    for batch, mesh, until in phases:
        fixed = tiny_config(
            lr_adaptation="adascale",
            lr_base_batch_size=8,
            global_batch_size=batch,
            mesh_shape=mesh,
            **budget,
        )
        with monkeypatch.context() as patch:
            if until is not None:
                stop_after(patch, until)
            trainer.train_and_evaluate(fixed, by_hand)
    assert losses(by_hand) == pytest.approx(want, rel=1e-6)
