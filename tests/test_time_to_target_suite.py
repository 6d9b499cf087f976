"""The time_to_target suite's study (jaxpar.bench.time_to_target): predictions come from the
reference row alone, the sync multipliers apply, and the table and plot are made. Pure
functions on hand-made rows: no training."""

from __future__ import annotations

import pytest

from jaxpar import suites as suite_lib
from jaxpar.bench import target_table
from jaxpar.bench import time_to_target as ttt
from jaxpar.plan import steps as steps_lib


def _row(name, batch, steps, step_time, time_s, noise=None, mode="allreduce", **config):
    spec = {"name": name, "config": {"global_batch_size": batch, "sync.mode": mode, **config}}
    table = {
        "name": name,
        "status": "ok",
        "error": None,
        "global_batch_size": batch,
        "num_devices": 8,
        "mesh_shape": [8, 1, 1],
        "mesh_axes": ["data", "stage", "tensor"],
        "step_time_median_s": step_time,
    }
    record = {
        "steps_to_target": steps,
        "time_to_target_s": time_s,
        "lr_rule": "noise",
        "noise_scale_to_target": noise,
        "accuracy_at_target": 0.91,
    }
    return spec, table, record


def _study(monkeypatch, factors=None):
    monkeypatch.setattr(steps_lib, "SYNC_STEP_FACTORS", factors or {})
    made = [
        _row("ref 64", 64, 120, 0.02, 2.4, noise=40.0),
        _row("b 16", 16, 300, 0.01, 3.0, noise=60.0),
        _row("b 1024", 1024, 70, 0.3, 21.0),
        _row("local 4", 64, 150, 0.02, 3.2, mode="local_sgd", **{"sync.period": 4}),
    ]
    specs, table, records = zip(*made)
    table = [dict(t) for t in table]
    noise = [
        {"step": s, "grad_sq_est": 1.0, "grad_trace_est": 10.0 if s <= 60 else 80.0}
        for s in range(1, 121)
    ]
    model = ttt.annotate(
        table,
        specs,
        {s["name"]: r for s, r in zip(specs, records)},
        noise_of=lambda name: noise if name == "ref 64" else [],
    )
    return table, model


def test_predictions_come_from_the_reference_row(monkeypatch):
    table, model = _study(monkeypatch)
    s_min = 120 / (1 + 40 / 64)
    assert model["reference_row"] == "ref 64" and model["min_steps"] == pytest.approx(s_min)
    by = {r["name"]: r for r in table}
    assert by["ref 64"]["predicted_steps_to_target"] == pytest.approx(120)
    assert by["b 16"]["predicted_steps_to_target"] == pytest.approx(s_min * (1 + 40 / 16))
    assert by["b 16"]["predicted_steps_error"] == pytest.approx(s_min * 3.5 / 300 - 1)
    # predicted time: the row's own step time x the predicted steps
    assert by["b 1024"]["predicted_time_to_target_s"] == pytest.approx(
        s_min * (1 + 40 / 1024) * 0.3
    )
    # the late B_noise: the second half of the reference's 120 steps only (80 / 1)
    assert model["noise_scale_late"] == pytest.approx(80.0)
    assert by["b 16"]["predicted_steps_late"] == pytest.approx(120 / (1 + 80 / 64) * 6)
    # no multiplier measured for local_sgd period 4: no prediction, said so in the table
    assert by["local 4"]["predicted_steps_to_target"] is None
    assert "no multiplier measured" in target_table.markdown(table, model)


def test_sync_multiplier_applies(monkeypatch):
    table, _ = _study(monkeypatch, {("local_sgd", 4): 1.25})
    (local,) = [r for r in table if r["name"] == "local 4"]
    assert local["sync_factor"] == 1.25
    assert local["predicted_steps_to_target"] == pytest.approx(120 * 1.25)


def test_summary_and_plot(monkeypatch, tmp_path):
    from jaxpar.bench.plots import time_to_target

    table, model = _study(monkeypatch, {("local_sgd", 4): 1.25})
    s = ttt.summary(table)
    assert s["rows_compared"] == 4 and s["spearman_time"] == pytest.approx(1.0)
    assert "Spearman" in target_table.markdown(table, model)
    assert target_table.to_csv(table).count("\n") == 5
    assert time_to_target(table, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 0


def test_the_suite_is_a_time_to_target_suite():
    spec = suite_lib.load_suite("time_to_target")
    assert ttt.is_study(spec) and not ttt.is_study(suite_lib.load_suite("batch_size"))
    assert spec.reference_row == spec.rows[0]["name"]
    assert len({r["config"]["global_batch_size"] for r in spec.rows}) >= 4
