"""The time_to_target suite's study (jaxpar.bench.time_to_target): predictions come from the
reference row alone, along its noise trace and with one B_noise, the sync step factors apply,
a goodput row is simulated on the fixed rows' step times, and the table and plot are made.
Pure functions on hand-made rows: no training."""

from __future__ import annotations

import pytest

from jaxpar import suites as suite_lib
from jaxpar.bench import target_table
from jaxpar.bench import time_to_target as ttt
from jaxpar.bench.records import Repeat, SuiteRow
from jaxpar.target import sync_factors
from jaxpar.target.reference import Reference
from jaxpar.target.steps import TracePoint
from tests.util import bench_row


def _row(name, batch, steps, step_time, time_s, noise=None, mode="allreduce", **config):
    spec = {"name": name, "config": {"global_batch_size": batch, "sync.mode": mode, **config}}
    table = bench_row(
        name=name,
        status="ok",
        global_batch_size=batch,
        num_devices=8,
        mesh_shape=[8, 1, 1],
        mesh_axes=["data", "stage", "tensor"],
        step_time_median_s=step_time,
    )
    record = {
        "steps_to_target": steps,
        "time_to_target_s": time_s,
        "lr_rule": "noise",
        "noise_scale_to_target": noise,
        "accuracy_at_target": 0.91,
    }
    return spec, table, record


# The reference row's run: 120 steps at batch 64, B_simple 10 for 60 steps, then 80.
REFERENCE = Reference(
    batch_size=64,
    steps_to_target=120,
    base_batch=64,
    trace=tuple(TracePoint(s, 10.0 if s <= 60 else 80.0) for s in range(1, 121)),
    noise_scale=40.0,
    lr_rule="noise",
)


def _study(monkeypatch, factors=None, goodput=False):
    monkeypatch.setattr(sync_factors, "SYNC_STEP_FACTORS", factors or {})
    made = [
        _row("ref 64", 64, 120, 0.02, 2.4, noise=40.0),
        _row("b 16", 16, 300, 0.01, 3.0, noise=60.0),
        _row("b 1024", 1024, 70, 0.3, 21.0),
        _row("local 4", 64, 150, 0.02, 3.2, mode="local_sgd", **{"sync.period": 4}),
    ]
    if goodput:
        made.append(_row("goodput", 64, 100, 0.03, 2.0, **{"goodput.every_steps": 10}))
    specs, table, records = zip(*made)
    records = {s["name"]: dict(r) for s, r in zip(specs, records)}
    if goodput:
        records["goodput"]["schedule_phases"] = [[0, "batch 64 on (8,1,1)"]]
    return ttt.annotate(
        list(table),
        tuple(map(SuiteRow.of_record, specs)),
        {name: Repeat.of_record(r) for name, r in records.items()},
        reference_of=lambda name: REFERENCE if name == "ref 64" else None,
    )


def test_predictions_come_from_the_reference_row_along_its_trace(monkeypatch):
    table, model = _study(monkeypatch)
    assert model.reference_row == "ref 64" and model.progress == 120
    by = {r.name: r for r in table}
    assert by["ref 64"].predicted_steps_to_target == pytest.approx(120)
    # along the trace: 60 steps at B_noise 10 and 60 at 80, each (1 + phi/B) / (1 + phi/64)
    along = 60 * (1 + 10 / 16) / (1 + 10 / 64) + 60 * (1 + 80 / 16) / (1 + 80 / 64)
    assert by["b 16"].predicted_steps_to_target == pytest.approx(along)
    assert by["b 16"].predicted_steps_error == pytest.approx(along / 300 - 1)
    # one B_noise (40) for the whole run: S_min (1 + 40 / B)
    one = 120 / (1 + 40 / 64) * (1 + 40 / 16)
    assert by["b 16"].target.predicted_steps_one_average == pytest.approx(one)
    # predicted time: the row's own step time x the predicted steps
    at_1024 = 60 * (1 + 10 / 1024) / (1 + 10 / 64) + 60 * (1 + 80 / 1024) / (1 + 80 / 64)
    assert by["b 1024"].predicted_time_to_target_s == pytest.approx(at_1024 * 0.3)
    # no step factor measured for local_sgd period 4: no prediction, said so in the table
    assert by["local 4"].predicted_steps_to_target is None
    assert "no step factor measured" in target_table.markdown(table, model)


def test_sync_step_factor_applies(monkeypatch):
    table, _ = _study(monkeypatch, {("local_sgd", 4): 1.25})
    (local,) = [r for r in table if r.name == "local 4"]
    assert local.target.sync_factor == 1.25
    assert local.predicted_steps_to_target == pytest.approx(120 * 1.25)


def test_a_goodput_row_is_simulated_on_the_fixed_rows_step_times(monkeypatch):
    """Batches 16, 64 and 1024 at 10, 20 and 300 ms a step, a decision every 10 steps. While
    B_noise is 10 (the reference's first 60 steps) batch 16 makes the most progress a second
    (gain 37/52 at 10 ms: 71, against batch 64's 50), each reference step costing it 52/37
    steps; the last decision in that phase, at 80 steps, stands until 90, so batch 16 also
    takes reference steps 61-63 at B_noise 80 (gain 0.375: 8/3 steps each), 92.32 steps in
    all; then batch 64 (50 a second, batch 16 37.5) takes the other 57 one step each. 149.32
    steps and 2.063 s, where batch 64 alone took 120 steps and 2.4 s."""
    table, _ = _study(monkeypatch, goodput=True)
    (row,) = [r for r in table if r.name == "goodput"]
    assert row.target.predicted_schedule == [[0, 16], [92, 64]]
    on_16 = 60 * 52 / 37 + 3 * 8 / 3
    assert row.predicted_steps_to_target == pytest.approx(on_16 + 57)
    assert row.predicted_time_to_target_s == pytest.approx(on_16 * 0.01 + 57 * 0.02)
    assert row.predicted_time_error == pytest.approx((on_16 * 0.01 + 1.14) / 2.0 - 1)


def test_summary_and_plot(monkeypatch, tmp_path):
    from jaxpar.bench.plots import time_to_target

    table, model = _study(monkeypatch, {("local_sgd", 4): 1.25})
    s = ttt.summary(table)
    assert s.rows_compared == 4
    assert "Spearman" in target_table.markdown(table, model)
    assert target_table.to_csv(table).count("\n") == 5
    assert time_to_target(table, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 0


def test_the_suite_is_a_time_to_target_suite():
    spec = suite_lib.load_suite("time_to_target")
    assert ttt.is_study(spec) and not ttt.is_study(suite_lib.load_suite("batch_size"))
    assert spec.reference_row == spec.rows[0]["name"]
    assert len({r["config"]["global_batch_size"] for r in spec.rows}) >= 4
