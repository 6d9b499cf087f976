"""The bench's row records: a results row written and read back through results.json and
results.csv unchanged, the columns in their order, a suite entry and a row's repeats read, and
one row folded from its repeats. Pure functions: no JAX program."""

from __future__ import annotations

import csv
import io
import json

import pytest

from configs.bench import row
from jaxpar.bench import results
from jaxpar.bench.records import Manifest, Repeat, SuiteRow
from jaxpar.bench.row_record import KEYS, BenchRow, TargetRow
from tests.util import bench_row


def _measured() -> BenchRow:
    """A row with a value of every kind a column holds."""
    return bench_row(
        name="8",  # a name that reads as a number stays text
        group="",
        scaling="strong",
        status="ok",
        mesh_shape=[2, 4],
        mesh_axes=["data", "fsdp"],
        num_devices=8,
        global_batch_size=64,
        repeats=2,
        images_per_sec=1234.5,
        images_per_sec_stderr=1e-05,
        input_bound=False,
        param_bytes=4096,
        collective_bytes_by_kind={"all-reduce": 4096, "all-gather": 512},
        collective_bytes_by_axis={"data": 4096},
        eval_accuracy=float("nan"),
        label="fixed lr 64",
        reference=[0.98, 0.99],
        seed=3,
        predicted_fits=True,
        sync_setting=4,
        error='exit status 1: a, "quoted" message',
    )


def test_a_row_reads_back_from_its_json_record():
    r = _measured()
    record = json.loads(json.dumps(r.as_record()))
    assert list(record) == list(KEYS)  # no study figures: the columns alone
    back = BenchRow.of_record(record)
    assert back.as_record().keys() == r.as_record().keys()
    assert json.dumps(back.as_record()) == json.dumps(r.as_record())
    studied = bench_row(name="b 16", target=TargetRow(sync_factor=1.25, model_curve=[[1, 2, 3]]))
    record = json.loads(json.dumps(studied.as_record()))
    assert list(record)[len(KEYS) :][:2] == ["sync_factor", "reference_row"]
    assert "predicted_schedule" not in record and record["model_curve"] == [[1, 2, 3]]
    assert BenchRow.of_record(record) == studied
    assert BenchRow.of_record({"name": "old", "status": "ok"}).images_per_sec is None


def test_a_row_reads_back_from_its_csv_line():
    rows = [_measured(), bench_row(name="failed", status="failed", error="not run")]
    text = results.to_csv(rows)
    header, first = next(csv.reader(io.StringIO(text))), text.splitlines()[1]
    assert tuple(header) == KEYS and '"{""all-reduce"": 4096, ""all-gather"": 512}"' in first
    back = results.of_csv(text)
    assert results.to_csv(back) == text
    got = back[0]
    assert (got.name, got.group, got.num_devices, got.images_per_sec) == ("8", "", 8, 1234.5)
    assert (got.images_per_sec_stderr, got.input_bound, got.predicted_fits) == (1e-05, False, True)
    assert got.collective_bytes_by_kind == {"all-reduce": 4096, "all-gather": 512}
    assert got.mesh_axes == ["data", "fsdp"] and got.reference == [0.98, 0.99]
    assert got.error == 'exit status 1: a, "quoted" message' and got.speedup is None
    assert got.eval_accuracy != got.eval_accuracy  # nan
    assert back[1] == rows[1]


def test_the_columns_keep_their_order():
    assert len(KEYS) == 89 and len(set(KEYS)) == 89
    assert KEYS[:5] == ("name", "group", "scaling", "status", "error")
    assert KEYS[-3:] == (
        "predicted_steps_late",
        "predicted_time_to_target_s",
        "predicted_time_error",
    )
    assert KEYS.index("eval_accuracy") < KEYS.index("label") < KEYS.index("predicted_profile")
    assert results.KEYS == KEYS and "target" not in KEYS


def test_a_suite_entry_and_the_manifest_read_back():
    entry = row(
        "data 2 seed 1",
        {"mesh_shape": (2, 1, 1), "seed": 1, "sync.mode": "local_sgd", "target_accuracy": 0.9},
        group="data",
        label="data 2",
        reference=(0.9, 0.95),
    )
    spec = SuiteRow.of_record(entry)
    assert spec.as_record() == entry
    assert (spec.seed, spec.mesh_shape, spec.mesh_axes, spec.sync_mode) == (
        1,
        (2, 1, 1),
        None,
        "local_sgd",
    )
    assert spec.trains_to_target and spec.goodput_every_steps == 50
    bare = SuiteRow.of_record({"name": "x", "config": {}})
    assert (bare.group, bare.scaling, bare.sync_mode, bare.trains_to_target) == (
        "",
        None,
        "allreduce",
        False,
    )
    manifest = Manifest(suite="configs/bench/scaling.py", overrides={"model.width": 0.125})
    assert Manifest.of_record(json.loads(json.dumps(manifest.as_record()))) == manifest


def _repeat(**record) -> Repeat:
    return Repeat.of_record({"status": "ok", "global_batch_size": 64, **record})


def test_a_row_from_its_repeats():
    """Mean and standard error over repeats, the p10/p90 rates from the step times, the
    first repeat's other figures, the suite entry's keys; a failed row keeps the mesh it
    asked for."""
    spec = SuiteRow.of_record(row("data 2", {"mesh_shape": (2, 1, 1), "seed": 7}, group="data"))
    repeats = [
        _repeat(
            images_per_sec=100.0,
            step_time_median_s=0.64,
            step_time_p10_s=0.5,
            step_time_p90_s=0.8,
            mesh_shape=[2, 1, 1],
            num_devices=2,
            param_bytes=400,
            data_allreduce_bytes=404,
            name="ignored",
            fingerprint="abc",
            machine={
                "jax": "0.10.2",
                "backend": "cpu",
                "device_kind": "cpu",
                "devices_present": 8,
                "cpu_cores": 2,
                "processor": "x86_64",
            },
        ),
        _repeat(images_per_sec=300.0, step_time_median_s=0.32, step_time_p10_s=0.25),
    ]
    assert repeats[0].fingerprint == "abc" and repeats[0].machine.devices_present == 8
    r = results.aggregate(spec, repeats)
    assert (r.name, r.group, r.label, r.seed, r.repeats, r.status) == (
        "data 2",
        "data",
        "data 2",
        7,
        2,
        "ok",
    )
    assert (r.images_per_sec, r.images_per_sec_stderr) == (200.0, 100.0)
    assert r.images_per_sec_p10 == 64 / 0.8 and r.images_per_sec_p90 == (128 + 256) / 2
    assert r.step_time_median_s == pytest.approx(0.48)
    assert r.data_allreduce_over_params == 404 / 400 and r.target is None
    failed = results.aggregate(
        SuiteRow.of_record(row("tensor 4", {"mesh_shape": (1, 1, 4)})),
        [_repeat(), Repeat.of_record({"status": "failed", "error": "boom"})],
    )
    assert (failed.status, failed.error, failed.images_per_sec) == ("failed", "boom", None)
    assert (failed.mesh_shape, failed.num_devices) == ([1, 1, 4], 4)
    assert failed.mesh_axes == ["data", "stage", "tensor"]
