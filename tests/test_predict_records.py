"""The predictor's and the planner's row records: each reads back what it writes, and writes
the keys predictions.json and plan.json have always had, in their order, for every way a row
can end (predicted, refused for its devices, refused by the trainer, failed in the planner)."""

import dataclasses
import json

from jaxpar.plan import Candidate, PlanRow
from jaxpar.predict import PredictedRow, Reference, Scaling

WORKLOAD = {
    "profile": "p",
    "model": "vgg11",
    "mesh_shape": (2, 2, 1),
    "mesh_axes": ("data", "stage", "tensor"),
    "num_devices": 4,
    "global_batch_size": 64,
    "schedule": "1f1b",
    "num_microbatches": 4,
    "memory_bytes_per_device": 2.0**30,
    "memory_from": "XLA:CPU",
    "memory_capacity_bytes": 2.0**34,
    "fits": True,
    "param_bytes": 1e6,
    "overlap": None,
}
TIMES = {
    "step_time_s": 0.5,
    "compute_s": 0.3,
    "comm_s": 0.1,
    "bubble_s": 0.05,
    "overhead_s": 0.05,
    "grad_allreduce_s": 0.02,
    "schedule_bubble": 0.1,
    "input_bound": False,
    "images_per_sec": 128.0,
    "analytic_bubble": 0.1,
}


def _round_trip(record):
    return type(record).of_record(json.loads(json.dumps(record.as_record())))


def test_a_predicted_row_writes_its_keys_in_order_and_reads_back():
    row = PredictedRow(
        name="pipe 4",
        status="ok",
        **WORKLOAD,
        **TIMES,
        collective_bytes_per_device={"all-reduce data": 4_000_000},
        scaling=Scaling(3.2, 0.8),
        reference=Reference(None, 0.85),
    )
    assert (
        list(row.as_record())
        == [
            "name",
            *WORKLOAD,
            "status",
            *list(TIMES)[:7],  # the times, the schedule's bubble among them (a pipeline)
            *list(TIMES)[7:],
            "collective_bytes_per_device",
            "speedup",
            "efficiency",
            "reference_images_per_sec",
            "reference_efficiency",
        ]
    )
    assert _round_trip(row) == row
    assert row.speedup == 3.2 and row.reference_efficiency == 0.85
    # not a pipeline, not scored: no schedule_bubble, speedup or efficiency keys
    plain = dataclasses.replace(row, schedule_bubble=None, scaling=None, reference=None)
    assert {"schedule_bubble", "speedup", "efficiency"}.isdisjoint(plain.as_record())
    assert _round_trip(plain) == plain and plain.speedup is None
    # an input-bound row carries its wait after the times
    waiting = dataclasses.replace(plain, input_wait_s=0.2, input_bound=True)
    keys = list(waiting.as_record())
    assert keys.index("input_wait_s") == keys.index("grad_allreduce_s") + 1
    assert _round_trip(waiting) == waiting


def test_refused_rows_keep_the_keys_they_were_refused_with():
    devices = PredictedRow(
        status="failed",
        mesh_shape=(8, 1, 1),
        mesh_axes=("data", "stage", "tensor"),
        num_devices=8,
        fits=False,
        error="needs 8 devices, profile p has 4",
    )
    assert list(devices.as_record()) == [
        "status",
        "mesh_shape",
        "mesh_axes",
        "num_devices",
        "fits",
        "error",
    ]
    trainer = PredictedRow(name="x", status="failed", error="batch 3 does not divide", fits=False)
    assert list(trainer.as_record()) == ["name", "status", "error", "fits"]
    built = PredictedRow(status="failed", error="needs 3 nodes", **WORKLOAD)
    assert list(built.as_record()) == [*WORKLOAD, "status", "error"]
    planner = PredictedRow(status="failed", error="RuntimeError: boom")
    assert list(planner.as_record()) == ["status", "error"]
    for row in (devices, trainer, built, planner):
        assert _round_trip(row) == row and not row.ok


def test_a_plan_row_puts_the_planner_s_keys_after_the_prediction_s():
    predicted = PredictedRow(status="ok", **WORKLOAD, **TIMES)
    candidate = Candidate((2, 2, 1), "1f1b", 4, True, 1, "flops")
    row = PlanRow(predicted, candidate, {"all-reduce data": 3}, speedup=2.5, fits_limit=True)
    record = row.as_record()
    assert list(record)[-5:] == [
        "collective_calls_per_step",
        "candidate",
        "name",
        "speedup",
        "fits_limit",
    ]
    assert record["name"] == "(2,2,1) 1f1b M=4 remat allreduce" == row.name
    assert record["candidate"]["exact"] is True
    assert _round_trip(row) == row
    failed = PlanRow(PredictedRow(status="failed", error="boom"), Candidate((1, 1, 1)))
    assert "collective_calls_per_step" not in failed.as_record()
    assert _round_trip(failed) == failed
