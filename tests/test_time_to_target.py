"""Time to a target: the noise-scale estimator against closed-form values, the steps model and
the learning-rate rule against the paper's relations, the target's summary figures from real
runs, and the one-line refusals of a plan from a run that cannot be planned from."""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import numpy as np
import pytest

from jaxpar import optim, run_setup, trainer
from jaxpar.errors import ConfigError
from jaxpar.noise_scale import NoiseScale
from jaxpar.plan import to_target
from jaxpar.plan.records import TargetRow
from jaxpar.run_spec import RateRule
from jaxpar.target import reading
from jaxpar.target import steps as steps_lib
from jaxpar.target.reference import Reference
from jaxpar.target.steps import TracePoint
from jaxpar.target.sync_factors import sync_factor
from tests.util import reached_summary, tiny_config


def test_estimator_recovers_the_closed_form_of_linear_regression():
    """Loss 0.5 (w.x - y)^2 with x ~ N(0, I_D), y = w*.x + eps, eps ~ N(0, s^2): at w, with
    d = w - w*, the per-example gradient (d.x - eps) x has mean G = d and E[g g^T] =
    (|d|^2 + s^2) I + 2 d d^T, so |G|^2 = |d|^2 and tr(Sigma) = (D + 1)|d|^2 + D s^2."""
    rng = np.random.default_rng(0)
    dim, s, groups, b_small, steps = 10, 0.5, 8, 4, 3000
    d = rng.normal(size=dim) * 0.3
    noise = NoiseScale(b_small=b_small, b_big=groups * b_small, decay=0.99)
    for step in range(1, steps + 1):
        x = rng.normal(size=(groups, b_small, dim))
        eps = rng.normal(size=(groups, b_small)) * s
        g = (x @ d - eps)[..., None] * x  # per-example gradients
        small = g.mean(axis=1)  # each group's gradient
        sq_small = float(np.mean(np.sum(small**2, axis=-1)))
        sq_big = float(np.sum(small.mean(axis=0) ** 2))
        noise.add(step, sq_small, sq_big)
    g2 = float(d @ d)
    trace = (dim + 1) * g2 + dim * s**2
    mean_g2 = np.mean([h[1] for h in noise.history])
    mean_trace = np.mean([h[2] for h in noise.history])
    assert mean_g2 == pytest.approx(g2, rel=0.05)
    assert mean_trace == pytest.approx(trace, rel=0.03)
    assert noise.average() == pytest.approx(trace / g2, rel=0.06)
    assert noise.smoothed == pytest.approx(trace / g2, rel=0.3)  # ~100 steps' worth


def test_the_naive_estimate_would_be_biased_where_the_unbiased_one_is_not():
    """|G_big|^2 alone overestimates |G|^2 by tr(Sigma)/B: the correction is what the
    estimator is for."""
    rng = np.random.default_rng(1)
    dim, d = 20, np.full(20, 0.05)
    noise = NoiseScale(b_small=2, b_big=16)
    naive = []
    for step in range(2000):
        x = rng.normal(size=(8, 2, dim))
        g = (x @ d - rng.normal(size=(8, 2)))[..., None] * x
        small = g.mean(axis=1)
        sq_big = float(np.sum(small.mean(axis=0) ** 2))
        naive.append(sq_big)
        noise.add(step + 1, float(np.mean(np.sum(small**2, -1))), sq_big)
    g2 = float(d @ d)
    assert np.mean(naive) > 10 * g2
    assert np.mean([h[1] for h in noise.history]) == pytest.approx(g2, rel=0.25)


def _reference(trace, batch=64, base=None, noise=40.0, rule="noise") -> Reference:
    points = tuple(TracePoint(i + 1, *p) for i, p in enumerate(trace))
    return Reference(batch, len(points), base or batch, points, noise, rule)


def test_a_constant_trace_is_the_papers_steps_model():
    """With one B_noise the trace model is S(B) = S_min (1 + B_noise / B) (McCandlish eq.
    2.11) through the reference, and E(B) = B S(B) = E_min (1 + B / B_noise)."""
    ref = _reference([(256.0,)] * 500, noise=256.0)
    assert ref.steps(64) == pytest.approx(500)
    s_min = 500 / (1 + 256 / 64)  # 100 steps at an infinite batch
    assert ref.min_steps == pytest.approx(100)
    for b in (16, 256, 1024):
        assert ref.steps(b) == pytest.approx(s_min * (1 + 256 / b))
        assert ref.steps(b) == pytest.approx(ref.steps_one_average(b))
        assert b * ref.steps(b) == pytest.approx(s_min * 256 * (1 + b / 256))
    assert ref.steps(256) / ref.steps(1024) == pytest.approx(2 / 1.25)  # S(B_noise) = 2 S_min


def test_the_trace_model_against_a_hand_integrated_trace():
    """Four reference steps at batch 32: B_simple not settled, 32, 96, 32, each a step of
    progress. At batch 128: all noise counts B0/B = 1/4; 32 counts (1 + 1/4) / (1 + 1) =
    0.625; 96 counts (1 + 0.75) / (1 + 3) = 0.4375: 1.9375 steps. A negative B_simple is no
    noise: 1 step at any batch."""
    ref = _reference([(math.inf,), (32.0,), (96.0,), (32.0,)], batch=32)
    assert ref.steps(128) == pytest.approx(0.25 + 0.625 + 0.4375 + 0.625)
    assert ref.steps(32) == pytest.approx(4)
    # under AdaScale each step counts the progress it made, at the base batch's gains
    adapted = _reference([(32.0, 2.0), (32.0, 2.0)], batch=64, base=16, rule="adascale")
    assert adapted.progress_to_target == 4
    assert adapted.steps(64) == pytest.approx(4 / ((1 + 2) / (1 + 0.5)))
    assert steps_lib.interpolated([(2, 10.0), (6, 50.0), (8, None), (9, -3.0)], 10) == [
        10.0,
        10.0,
        20.0,
        30.0,
        40.0,
        50.0,
        50.0,
        math.inf,
        0.0,
        0.0,
    ]


def _write_run(workdir, phis, batch=64, gains=None, lr_adaptation="none"):
    """A finished run's metrics.jsonl as the trainer writes it: a noise line a step, then the
    summary (util.reached_summary: the target reached at the last step)."""
    workdir.mkdir(parents=True, exist_ok=True)
    lines = []
    for step, phi in enumerate(phis, 1):
        line = {"step": step, "split": "noise", "noise_scale": phi}
        if gains:
            line.update(gain=gains[step - 1], progress=sum(gains[:step]))
        lines.append(line)
    summary = reached_summary(len(phis), batch)
    summary = dataclasses.replace(
        summary, rate=dataclasses.replace(summary.rate, lr_adaptation=lr_adaptation)
    )
    done = {"step": len(phis), "split": "summary", **summary.as_record()}
    (workdir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in [*lines, done]))


def test_a_workdir_and_a_json_file_give_the_same_prediction_from_the_same_trace(tmp_path):
    phis = [None] * 5 + [20.0 + 4 * i for i in range(25)]
    _write_run(tmp_path / "run", phis)
    sparse = [[s, p] for s, p in enumerate(phis, 1) if p is None or s % 6 == 0 or s == 30]
    (tmp_path / "ref.json").write_text(
        json.dumps(
            {
                "batch_size": 64,
                "steps_to_target": 30,
                "lr_rule": "noise",
                "noise_scale": 50.0,
                "noise_trace": sparse,
                "target_accuracy": 0.9,
            }
        )
    )
    run = reading.load(str(tmp_path / "run"), 0.9)
    from_json = reading.load(str(tmp_path / "ref.json"), 0.9)
    for batch in (16, 64, 256, 4096):
        # a linear trace read every sixth step is the same trace
        assert from_json.steps(batch) == pytest.approx(run.steps(batch), rel=1e-12)
        assert from_json.steps_one_average(batch) == pytest.approx(run.steps_one_average(batch))
    # an AdaScale run's steps count the progress their gains made, at its base batch
    _write_run(tmp_path / "adapted", [40.0] * 20, gains=[1.5] * 20, lr_adaptation="adascale")
    adapted = reading.load(str(tmp_path / "adapted"))
    assert adapted.base_batch == 16 and adapted.progress_to_target == pytest.approx(30)
    assert adapted.steps(16) == pytest.approx(30)


def test_learning_rate_rules_across_batches():
    lr, base, bn = 0.1, 64, 192.0
    assert optim.batch_scaled_rate("noise", lr, base, base, bn) == pytest.approx(lr)
    eps_max = lr * (1 + bn / base)
    assert optim.batch_scaled_rate("noise", lr, base, 10**9, bn) == pytest.approx(eps_max)
    assert optim.batch_scaled_rate("noise", lr, base, 192, bn) == pytest.approx(eps_max / 2)
    assert optim.batch_scaled_rate("linear", lr, base, 256) == pytest.approx(0.4)
    config = tiny_config(
        lr_noise_scale=bn, lr_base_batch_size=base, global_batch_size=192, learning_rate=lr
    )
    assert optim.batch_rule(RateRule.of_config(config)) == "noise"
    assert optim.peak_learning_rate(RateRule.of_config(config)) == pytest.approx(eps_max / 2)


def _run(tmp_path, **overrides):
    config = tiny_config(mesh_shape=(2, 1, 1), num_devices=2, **overrides)
    return trainer.train_and_evaluate(config, str(tmp_path)).summary


def test_a_run_stops_at_its_target_and_reports_steps_examples_and_time(tmp_path):
    summary = _run(
        tmp_path,
        num_train_steps=6,
        eval_every_steps=2,
        target_eval_loss=100.0,
        stop_at_target=True,
        checkpoint_every_steps=0,
    )
    assert summary.target.target_reached is True
    assert summary.steps_to_target == 2 == summary.steps  # the first evaluation
    assert summary.target.reached.examples_to_target == 2 * 16
    assert 0 < summary.target.reached.time_to_target_s < summary.wall_time_s
    lines = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    noise = [x for x in lines if x["split"] == "noise"]
    assert [x["step"] for x in noise] == [1, 2]  # one line a step, none after the stop
    assert summary.noise.noise_scale_b_small == 8 and summary.noise.noise_scale_b_big == 16
    assert summary.noise.noise_scale_steps == 2
    with pytest.raises(ConfigError, match="measured over 2 steps to the target; at least 20"):
        reading.load(str(tmp_path))  # too short a run to plan from


def test_a_target_never_reached_ends_the_run_normally(tmp_path):
    summary = _run(
        tmp_path,
        num_train_steps=3,
        eval_every_steps=1,
        target_accuracy=1.0,
        stop_at_target=True,
        checkpoint_every_steps=0,
    )
    assert summary.target.target_reached is False and summary.steps == 3
    assert "steps_to_target" not in summary.as_record()
    with pytest.raises(ConfigError, match="never reached its target"):
        reading.load(str(tmp_path), 1.0)


def test_from_run_refusals_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such workdir"):
        reading.load(str(tmp_path / "nope"))
    bad = tmp_path / "ref.json"
    bad.write_text(json.dumps({"batch_size": 64, "steps_to_target": 100}))
    with pytest.raises(ConfigError, match="missing lr_rule, noise_scale or noise_trace"):
        reading.load(str(bad))
    unsettled = {"batch_size": 64, "steps_to_target": 100, "lr_rule": "noise"}
    bad.write_text(json.dumps({**unsettled, "noise_trace": [[10, None], [20, None]]}))
    with pytest.raises(ConfigError, match="never settled"):
        reading.load(str(bad))
    bad.write_text(json.dumps({**unsettled, "noise_scale": 40, "target_accuracy": 0.8}))
    with pytest.raises(ConfigError, match="reached accuracy 0.8, not 0.9"):
        reading.load(str(bad), 0.9)
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps({**unsettled, "noise_trace": [[10, 50.0], [100, 150.0], [200, 900.0]]})
    )
    ref = reading.load(str(good))
    # one B_noise from a trace alone: the mean of its per-step values up to the target
    # (10 steps at 50, then 50 -> 150 over steps 11-100)
    assert ref.noise_scale == pytest.approx(
        (10 * 50 + sum(50 + k * 100 / 90 for k in range(1, 91))) / 100
    )
    assert [p.noise_scale for p in ref.trace[:11:5]] == [50.0, 50.0, pytest.approx(50 + 100 / 90)]


def _row(batch, step_s, steps, sync="allreduce", fits=True, mesh_shape=(1, 1, 1)):
    return TargetRow(
        name=f"B={batch} {sync}",
        candidate=sync,
        mesh_axes=["data"],
        mesh_shape=list(mesh_shape),
        global_batch_size=batch,
        sync_mode=sync,
        step_s=step_s,
        images_per_sec=batch / step_s,
        memory_bytes_per_device=1.0,
        fits=fits,
        learning_rate=None,
        steps_to_target=steps,
        time_to_target_s=None if steps is None else steps * step_s,
    )


def test_ranking_by_time_to_target_and_what_decides():
    rows = [
        _row(128, 0.010, 400),  # images/sec's pick at the config's batch: 4.0 s
        _row(1024, 0.050, 60),  # 3.0 s: fewer steps win over a slower step
        _row(1024, 0.020, 60, fits=False),  # would be soonest, but does not fit
        _row(128, 0.012, None, sync="async"),  # no multiplier: not ranked
    ]
    ranking = to_target.rank(rows, 128)
    ranked, pick = ranking.ranked, ranking.pick
    assert [r.time_to_target_s for r in ranked] == [pytest.approx(3.0), pytest.approx(4.0)]
    assert pick.name == rows[0].name and pick.step_s == rows[0].step_s
    assert ranked[0].decided_by == "steps"
    assert [r.decided_by for r in ranking.rows] == ["steps", "steps", "memory", None]
    assert "changes the winner (batch)" in to_target.verdict(ranked, pick)
    assert math.isclose(sync_factor("sharded"), 1.0)


def test_plan_refuses_a_reference_it_cannot_use_before_compiling(tmp_path, capsys):
    from jaxpar.plan.__main__ import main

    base = ["--config", "configs/vgg19_data.py", "--profile", "configs/hardware/h100_sxm_x8.py"]
    assert main([*base, "--from-run", str(tmp_path)]) == 2
    assert "--from-run needs --target-accuracy" in capsys.readouterr().err
    assert main([*base, "--target-accuracy", "0.9", "--from-run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no finished run there" in err and len(err.splitlines()) == 1


@functools.cache
def _data_8_norms():
    return _first_norms(tiny_config(mesh_shape=(8, 1, 1)))


def _first_norms(config):
    import jax

    setup = run_setup.setup(config, jax.devices()[:8])
    state = setup.strategy.init_state(jax.random.key(0))
    batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, 0))
    _, metrics = setup.strategy.train_step(state, batch)
    metrics = jax.device_get(metrics)
    return setup.strategy.noise_groups(), metrics["grad_sq_small"], metrics["grad_sq_big"]


@pytest.mark.parametrize(
    "overrides",
    [
        {"mesh_axes": ("node", "data", "tensor"), "mesh_shape": (2, 2, 2), "grad_accum_steps": 2},
        {"mesh_axes": ("data", "spatial"), "mesh_shape": (4, 2), "grad_accum_steps": 2},
        {"mesh_shape": (8, 1, 1), "sync.mode": "sharded"},
        {"mesh_shape": (8, 1, 1), "sync.mode": "parameter_server"},
    ],
    ids=["node-data-tensor", "data-spatial", "sharded", "parameter_server"],
)
def test_the_same_groups_give_the_same_norms_on_any_mesh_and_exact_sync_mode(overrides):
    """Eight groups of two rows each, in row order: whether they are replicas over node x data,
    or slices of replicas beside tensor or spatial splits, or replicas under another exact
    sync mode, the two squared norms are those of data parallelism over 8."""
    ref = _data_8_norms()
    got = _first_norms(tiny_config(**overrides))
    assert got[0] == ref[0] == 8
    np.testing.assert_allclose(got[1:], ref[1:], rtol=2e-6)


def test_global_batch_norm_couples_replicas_so_nothing_is_measured():
    """Under BatchNorm over the global batch a replica's gradient is not that of its own
    images: the step refuses to measure (one line), and measures per replica under local
    BatchNorm."""
    import jax

    def groups(**overrides):
        config = tiny_config(mesh_shape=(2, 1, 1), num_devices=2, **overrides)
        return run_setup.setup(config, jax.devices()[:2]).strategy.noise_groups()

    refused = groups(**{"model.batch_norm": True})
    assert isinstance(refused, str) and "sync.batch_norm=local" in refused
    assert groups(**{"model.batch_norm": True, "sync.batch_norm": "local"}) == 2


@pytest.mark.parametrize(
    "overrides",
    [
        {"mesh_axes": ("data", "tensor"), "mesh_shape": (2, 4), "grad_accum_steps": 2},
        {"mesh_axes": ("data", "fsdp"), "mesh_shape": (2, 4)},
    ],
    ids=["data-tensor", "data-fsdp"],
)
def test_measuring_moves_scalars_only(overrides):
    """The compiled step's collectives with the measurement on against off: a few calls more,
    carrying scalars (the norms' sums; under tensor, XLA sums each leaf's squares over the
    axis, for each slice and the combined gradient), never a gradient gathered or reduced
    again."""
    import jax

    from jaxpar import analysis

    def moved(on: bool):
        config = tiny_config(measure_noise_scale=on, **overrides)
        strategy = run_setup.setup(config, jax.devices()[:8]).strategy
        report = analysis.report(strategy, config.global_batch_size, timing=False)
        calls = sum(row[3] for row in report["collectives"])
        return report["collective_bytes_per_device"], calls

    (off, calls_off), (on, calls_on) = moved(False), moved(True)
    leaves = 18  # vgg11's parameter leaves (8 convs and 1 dense, kernel and bias each)
    gradients = 1 + overrides.get("grad_accum_steps", 1)  # the slices' and the combined
    assert off > 10_000  # the gradient's own traffic
    assert 0 < on - off <= 4 * (gradients * leaves + 4), (on, off)  # float32 scalars
    assert 0 < calls_on - calls_off <= 4, (calls_on, calls_off)


def test_a_target_met_before_a_resume_keeps_its_step(tmp_path):
    common = {
        "eval_every_steps": 2,
        "target_eval_loss": 100.0,
        "checkpoint_every_steps": 2,
        "schedule_steps": 6,
    }
    first = _run(tmp_path, num_train_steps=4, **common)
    assert first.steps_to_target == 2 and first.target.reached.time_to_target_s > 0
    resumed = _run(tmp_path, num_train_steps=6, **common)  # continues from step 4
    assert resumed.steps == 6 and resumed.steps_to_target == 2
    assert resumed.target.reached.time_to_target_s is None  # the first run's clock is not kept


def test_the_planner_ranks_a_goodput_schedule_beside_the_fixed_rows():
    """Rows of one partitioning at batches 16 and 64 (10 and 20 ms), the reference's trace at
    B_noise 10 then 80: the schedule (batch 16, then 64) reaches the target sooner than either
    batch alone and keeps its phases; as a fixed row it is never images/sec's pick."""
    ref = _reference([(10.0,)] * 60 + [(80.0,)] * 60)
    rows = []
    for batch, step_s in ((16, 0.01), (64, 0.02)):
        row = _row(batch, step_s, ref.steps(batch), mesh_shape=[8, 1, 1])
        rows.append(dataclasses.replace(row, sync_steps_factor=1.0, candidate="(8,1,1) allreduce"))
    (schedule,) = to_target.schedule_rows(rows, ref, every=10)
    assert [phase[1] for phase in schedule.schedule_phases] == [16, 64]
    assert schedule.time_to_target_s < min(r.time_to_target_s for r in rows)
    ranking = to_target.rank([*rows, schedule], 64)
    assert ranking.ranked[0].name == schedule.name and ranking.pick.name == rows[1].name
    assert "goodput: B=16 (8,1,1) allreduce, then B=64" in to_target.table(ranking.ranked, 3)[2]


def test_the_reference_cli_prints_its_trace_and_predictions(tmp_path, capsys):
    from jaxpar.target.__main__ import main

    _write_run(tmp_path / "run", [None] * 4 + [30.0] * 26)
    assert main(["--from-run", str(tmp_path / "run"), "--batches", "16,256"]) == 0
    out = capsys.readouterr().out
    assert "batch 64 reached it in 30 steps" in out and "| 256 |" in out
    assert main(["--from-run", str(tmp_path / "run"), "--batches", "x"]) == 2
    assert "comma-separated integers" in capsys.readouterr().err


def test_sync_step_factors_measured_on_the_model_are_kept_beside_the_reference(tmp_path):
    """--calibrate-sync's paired runs: allreduce and local SGD (period 2) to the same target
    from the same config and seed; the factor is the ratio of their steps, kept beside the
    reference and read back with it, and the planner prefers it to the constants."""
    from jaxpar.plan import calibrate_sync

    config = tiny_config(mesh_shape=(2, 1, 1), num_devices=2, num_train_steps=4, eval_every_steps=1)
    assert calibrate_sync.settings("", config) == [("local_sgd", 4), ("async", 2)]
    with pytest.raises(ConfigError, match="MODE:SETTING"):
        calibrate_sync.settings("local_sgd:x", config)
    record = calibrate_sync.calibrate(config, [("local_sgd", 2)], 0.01, tmp_path)
    (factor,) = record.factors
    assert factor.steps_to_target == factor.allreduce_steps_to_target == 1
    assert factor.factor == 1.0
    _write_run(tmp_path / "ref", [30.0] * 25)
    path = calibrate_sync.store(record, reading.load(str(tmp_path / "ref")))
    assert path == tmp_path / "ref" / "sync_factors.json"
    assert json.loads(path.read_text())["factors"][0]["factor"] == 1.0  # the file's keys
    ref = reading.load(str(tmp_path / "ref"))
    assert ref.sync_factors == {("local_sgd", 2): 1.0}
    assert sync_factor("local_sgd", 2, ref.sync_factors) == 1.0
    assert sync_factor("local_sgd", 4, ref.sync_factors) == 1.15  # the fallback constants
