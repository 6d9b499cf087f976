"""The bench's and the planner's typed records: each reads back what it writes, and writes
the keys its file has always had (plan.json, time_to_target.json, a row's machine)."""

import json

from jaxpar.bench.records import Machine, Prediction, TargetModel, TargetSummary
from jaxpar.plan.records import Measured, TargetRow


def _round_trip(record):
    return type(record).of_record(json.loads(json.dumps(record.as_record())))


def test_a_target_row_leaves_out_what_does_not_apply_and_reads_back():
    row = TargetRow(
        "B=64 (8,1,1)",
        "(8,1,1)",
        ["data"],
        [8, 1, 1],
        64,
        "allreduce",
        0.02,
        3200.0,
        2.0**30,
        True,
        0.1,
        steps_to_target=100.0,
        time_to_target_s=2.0,
        sync_steps_factor=1.0,
        sync_factor_source="exact",
        decided_by="same",
    )
    keys = list(row.as_record())
    assert keys[:11] == [
        "name",
        "candidate",
        "mesh_axes",
        "mesh_shape",
        "global_batch_size",
        "sync_mode",
        "step_s",
        "images_per_sec",
        "memory_bytes_per_device",
        "fits",
        "learning_rate",
    ]
    assert keys[11:] == [
        "steps_to_target",
        "time_to_target_s",
        "sync_steps_factor",
        "sync_factor_source",
        "decided_by",
    ]
    assert _round_trip(row) == row
    skipped = TargetRow(
        "B=64 async",
        "(8,1,1)",
        ["data"],
        [8, 1, 1],
        64,
        "async",
        0.02,
        3200.0,
        1.0,
        True,
        None,
        skipped_reason="no step factor",
    )
    record = skipped.as_record()
    assert record["steps_to_target"] is None and "decided_by" not in record
    assert "sync_steps_factor" not in record and record["skipped_reason"] == "no step factor"


def test_the_other_records_read_back_what_they_write():
    model = TargetModel("ref 64", 64, 120, 64, 120.0, 40.0, 73.8, [(1, 24, 10.0), (25, 48, 80.0)])
    summary = TargetSummary(4, 0.8, 0.1, 0.2, 0.3, 0.4, 0.1, 0.2)
    machine = Machine("0.10.2", "cpu", "cpu", 8, 2, "x86_64")
    measured = Measured("(8,1,1) allreduce", 100.0, None, None, "failed", "boom")
    for record in (model, summary, machine, measured):
        assert _round_trip(record) == record
    assert machine.describe() == "8 cpu devices (cpu) on 2 CPU cores, JAX 0.10.2"
    assert list(summary.as_record())[:2] == ["rows_compared", "spearman_time"]


def test_a_prediction_takes_the_fields_it_knows_and_none_for_the_rest():
    p = Prediction.of_record({"name": "a", "status": "ok", "images_per_sec": 10.0, "other": 1})
    assert (p.name, p.status, p.images_per_sec, p.step_time_s) == ("a", "ok", 10.0, None)
