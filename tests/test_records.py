"""The typed records: each reads back what it writes, and writes the keys its file has always
had (a run's summary line in metrics.jsonl, plan.json, time_to_target.json, a row's machine)."""

import dataclasses
import json

from jaxpar.bench.records import Machine, TargetModel, TargetSummary
from jaxpar.plan.records import Measured, TargetRow
from jaxpar.step_report import StepReport
from jaxpar.summary_record import (
    AdaptedProgress,
    CompileCacheFigures,
    InputCost,
    RunSummary,
    SchedulePhases,
    Throughput,
    TrainSplit,
)
from jaxpar.target.sync_factors import MeasuredFactor, MeasuredFactors
from tests.util import reached_summary


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


# The summary line of `python -m jaxpar.train --config configs/vgg19_hybrid.py
# --config.num_train_steps=20` on 8 CPU devices, its collectives cut to the first three rows.
HYBRID_LINE = {
    "step": 20,
    "split": "summary",
    "strategy": "pipeline",
    "partitioning": "hybrid data 2 x pipeline 2 (1f1b) x tensor 2",
    "num_devices": 8,
    "mesh_shape": [2, 2, 2],
    "mesh_axes": ["data", "stage", "tensor"],
    "mesh": "(data=2, stage=2, tensor=2)",
    "steps": 20,
    "global_batch_size": 128,
    "images_per_sec": 153.02470838351775,
    "step_time_median_s": 0.8364662239982863,
    "step_time_p10_s": 0.7899589432010543,
    "step_time_p90_s": 0.887141149402305,
    "timed_steps": 15,
    "input_s_per_step": 0.01408644400362391,
    "input_put_s_per_step": 0.012638704502023757,
    "input_wait_s_per_step": 0.0006494892504633754,
    "input_wait_share": 0.0007747231722946656,
    "loader_images_per_sec": 9086.750351406674,
    "input_bound": False,
    "compile_time_s": 18.83424667300278,
    "wall_time_s": 70.29436529999657,
    "final_loss": 2.295764684677124,
    "eval_loss": 2.319787353515625,
    "eval_accuracy": 0.133,
    "num_params": 1256922,
    "model_flops_per_image": 151297536,
    "param_bytes": 5027688,
    "param_bytes_per_device": 2297256,
    "opt_state_bytes_per_device": 4594520,
    "state_bytes_per_device": 9193388,
    "program_temp_bytes_per_device": 9196136,
    "stored_activation_bytes_per_device": 393216,
    "memory_bytes_per_device": 15256788,
    "memory_per_device_bytes": [10467188, 15256788],
    "collectives": [
        ["stage 0", "all-gather", "tensor", 52, 20971520, 1],
        ["stage 0", "all-reduce", "data", 85, 232992, 1],
        ["stage 0", "all-reduce", "tensor", 24, 9961472, 1],
    ],
    "collective_bytes_per_device": 31165984,
    "collective_bytes_by_kind": {"all-gather": 20971520, "all-reduce": 10194464},
    "collective_bytes_by_axis": {"tensor": 30932992, "data": 232992},
    "data_allreduce_bytes": 232992,
    "halo_bytes_per_device": 0,
    "ring_allreduce_wire_bytes": 232992.0,
    "num_stages": 2,
    "pipeline_schedule": "1f1b",
    "num_microbatches": 4,
    "stage_bounds": [0, 7, 17],
    "analytic_bubble": 0.2,
    "analytic_bubble_formula": "(K-1)/(M+K-1)",
    "measured_bubble": 0.21472674460221208,
    "stage_time_predicted_s": None,
    "stage_time_measured_s": [0.11097542400966631, 0.0919476740018581],
    "bytes_between_stages_per_step": 4194304,
    "stage_transfer_bytes_per_device": 1048576,
    "peak_stash_bytes_per_device": [393216, 262144],
    "stage_state_bytes_per_device": [877836, 9193388],
    "stage_program_temp_bytes": [9196136, 5801256],
    "model_tflops_per_sec": 0.023152261325544776,
    "train_examples": 10000,
    "epochs": 0.256,
    "seconds_per_epoch": 65.34892374986612,
    "lr_rule": "none",
    "lr_adaptation": "none",
    "peak_learning_rate": 0.001,
    "lr_base_batch_size": 256,
    "sync_mode": "allreduce",
    "compile_cache_dir": "/root/.cache/jaxpar/xla",
    "compile_cache_hits": 35,
    "compile_cache_misses": 5,
    "xla_programs": 96,
    "xla_programs_cached": 83,
    "xla_compile_s": 35.991883993148804,
}


def test_a_summary_line_reads_back_to_its_keys_in_their_order():
    summary = RunSummary.of_record(HYBRID_LINE)
    assert summary.mesh_shape == (2, 2, 2) and summary.report.pipeline_schedule == "1f1b"
    assert summary.throughput.timed_steps == 15 and summary.rate.sync_mode == "allreduce"
    assert summary.target is None and summary.noise is None and summary.train_split is None
    line = {"step": 20, "split": "summary", **summary.as_record()}
    assert list(line) == list(HYBRID_LINE)
    assert json.loads(json.dumps(line)) == HYBRID_LINE


def test_a_summary_with_every_part_reads_back_what_it_writes():
    full = dataclasses.replace(
        reached_summary(30),
        throughput=Throughput(100.0, 0.64, 0.6, 0.7, 27),
        input_cost=InputCost(0.01, 0.002, 0.001, 0.0016, 6400.0, False),
        report=StepReport(param_bytes=4000, stage_bounds=[0, 7, 17], measured_bubble=0.21),
        model_tflops_per_sec=0.0003,
        train_examples=10_000,
        epochs=0.192,
        seconds_per_epoch=100.0,
        adapted=AdaptedProgress(40.0, 1.33, 35.0),
        schedule=SchedulePhases([[0, "batch 8 on (8,1,1)"], [12, "batch 16 on (8,1,1)"]], 1.5),
        compile_cache=CompileCacheFigures(None, 0, 0, 12, 0, 3.5),
        train_split=TrainSplit(0.3, 0.95, 512, 0.04),
    )
    assert _round_trip(full) == full
    keys = list(full.as_record())
    order = ["timed_steps", "input_bound", "compile_time_s", "param_bytes"]
    order += ["stage_program_temp_bytes", "model_tflops_per_sec", "seconds_per_epoch"]
    order += ["target", "target_accuracy", "steps_to_target", "eval_loss_at_target", "lr_rule"]
    order += ["noise_scale_to_target", "progress_to_target", "schedule_moves_s"]
    order += ["compile_cache_dir", "xla_compile_s", "train_eval_loss", "generalization_gap"]
    assert [keys.index(k) for k in order] == sorted(keys.index(k) for k in order)
    # a part the run did not have leaves its keys out; a figure that is None stays, as null
    noise = dataclasses.replace(full.noise, noise_scale_last=None, to_target=False)
    bare = dataclasses.replace(full, target=None, noise=noise, adapted=None, train_split=None)
    record = bare.as_record()
    assert "target" not in record and "steps_to_target" not in record
    assert "noise_scale_to_target" not in record and record["noise_scale_last"] is None
    assert "progress" not in record and "train_eval_loss" not in record
    assert record["compile_cache_dir"] is None and record["stage_time_predicted_s"] is None
    bare = dataclasses.replace(bare, noise=dataclasses.replace(noise, noise_scale_to_target=None))
    assert _round_trip(bare) == bare


def test_measured_sync_factors_read_back_and_keep_only_the_modes_that_reached():
    reached = MeasuredFactor("local_sgd", 2, 30, 25, 1.2, None)
    missed = MeasuredFactor("async", 1, None, 25, None, 4.0)
    record = MeasuredFactors(64, 0, 0.9, (reached, missed))
    assert _round_trip(record) == record
    assert list(record.as_record()["factors"][0]) == [
        "mode",
        "setting",
        "steps_to_target",
        "allreduce_steps_to_target",
        "factor",
        "at_least",
    ]
    assert record.reached() == {("local_sgd", 2): 1.2}
