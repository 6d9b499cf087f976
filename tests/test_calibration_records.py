"""The predictor's calibration records: each reads back what it writes, and writes the keys (and
their order) its file has always had: a profile file's runs and MEASURED dict, a kernel table's
columns, a joined-kernel CSV, a suite's rows, a bench sweep's measured 1-device rows."""

import dataclasses
import json

import pytest

from jaxpar import suites
from jaxpar.predict.calibrate import model_runs, sources, traces
from jaxpar.predict.calibrate.records import Microbenchmarks, TracedCosts
from jaxpar.predict.kernels import kernel_table
from jaxpar.predict.profiles.records import CalibrationRun


def test_a_calibration_run_writes_back_the_keys_it_was_read_with_in_their_order():
    published = {  # configs/hardware/dgx1_p100.py's form: no head, dtype last
        "model": "resnet50",
        "width": 1.0,
        "batch_norm": True,
        "image_shape": (224, 224, 3),
        "num_classes": 1000,
        "batch_size": 64,
        "images_per_sec": 219.0,
        "dtype": "float32",
    }
    run = CalibrationRun.of_record(published)
    assert run.head == "auto" and run.name == "" and run.step_s == pytest.approx(64 / 219.0)
    assert list(run.as_record().items()) == list(published.items())
    # a field set afterwards, or given away from its default, is written too (after the rest)
    named = dataclasses.replace(run, name="r", head="imagenet").as_record()
    assert list(named)[-2:] == ["name", "head"] and named["head"] == "imagenet"
    assert CalibrationRun.of_record(named) == dataclasses.replace(run, name="r", head="imagenet")
    # what a run measured does not tell its program apart
    other = dataclasses.replace(run, name="x", images_per_sec=1.0, memory_bytes=2.0)
    assert other != run and other.identity() == run.identity()
    with pytest.raises(ValueError, match="no field 'batch'"):
        CalibrationRun.of_record({**published, "batch": 64})


def test_a_row_s_run_is_written_into_a_profile_file_in_the_order_it_always_was():
    run = dataclasses.replace(model_runs.parse_row("vgg19:0.25:32:float32:32"), images_per_sec=5.0)
    assert list(run.as_record()) == [
        "name",
        "model",
        "width",
        "batch_norm",
        "head",
        "image_shape",
        "num_classes",
        "dtype",
        "batch_size",
        "images_per_sec",
    ]
    assert run.as_record()["image_shape"] == (32, 32, 3)


def _measured(gpu: bool) -> dict:
    """A MEASURED dict as device_rates.microbenchmarks and --calibrate-here make it."""
    dtypes = ("float32", "bfloat16") if gpu else ("float32",)
    out = {"platform": "gpu" if gpu else "cpu", "device_kind": "d", "jax": "0.10.2"}
    out |= {"seconds": 0.5, "num_devices": 8}
    for i, dtype in enumerate(dtypes):
        out[f"matmul_{dtype}"] = {256: 1e9 + i, 512: 2e9 + i}
        out[f"{dtype}_flops_per_s"] = 2e9 + i
        out[f"thin_conv_{dtype}"] = 5e8 + i
        if gpu:
            out[f"narrow_conv_{dtype}"] = {8: 1e8 + i, 16: 2e8 + i}
    out |= {"matmul_flops_per_s": 2e9, "memory_bandwidth_array_bytes": 1 << 26}
    out |= {"memory_bandwidth": 1e10, "launch_s": 1e-5, "sync_call_s": 2e-5}
    out |= {"kernel_s": 1e-6, "peak_memory_bytes": 1e9}
    if gpu:
        out["traced"] = {"rows": ["a"], "not_traced": [], "skipped": "no row traced"}
        out["devices_here"] = 1
    return out


@pytest.mark.parametrize("gpu", [False, True])
def test_measured_figures_read_back_in_their_order(gpu):
    measured = _measured(gpu)
    micro = Microbenchmarks.of_record(measured)
    assert list(micro.as_record().items()) == list(measured.items())
    assert micro.flops_per_s == {d: measured[f"{d}_flops_per_s"] for d in micro.matmul}
    assert (micro.traced is not None) == gpu and (micro.devices_here == 1) == gpu
    if gpu:
        assert micro.narrow_conv["bfloat16"] == {8: 1e8 + 1, 16: 2e8 + 1}
        assert micro.traced.skipped == "no row traced" and micro.traced.kernel_s is None


def test_traced_costs_leave_out_what_was_not_reached():
    assert TracedCosts(skipped="why").as_record() == {"skipped": "why"}
    fitted = TracedCosts(["r"], [], 0.95, kernel_s=1e-6, memory_bandwidth=1e12)
    assert list(fitted.as_record()) == [
        "rows",
        "not_traced",
        "named_share",
        "kernel_s",
        "memory_bandwidth",
    ]
    assert TracedCosts.of_record(fitted.as_record()) == fitted


def test_a_kernel_table_row_reads_its_csv_columns_and_writes_them_back(tmp_path):
    columns = ["W", "H", "C", "N", "K", "R", "S", "pad_h", "pad_w", "stride_h", "stride_w"]
    columns += ["forward_ms", "input_grad_ms", "filter_grad_ms"]
    values = ["7", "7", "512", "8", "2048", "1", "1", "0", "0", "1", "1", "0.5", "0.25", "0.125"]
    line = dict(zip(columns, values))
    row = kernel_table.ConvRow.of_record(line)
    assert (row.w, row.c, row.k, row.stride_w) == (7, 512, 2048, 1) and row.forward_ms == 0.5
    assert list(row.as_record()) == columns
    assert row.shape == dataclasses.replace(row, forward_ms=0, input_grad_ms=0, filter_grad_ms=0)
    assert row.out_hw == (7, 7) and dataclasses.replace(row, stride_h=2).out_hw == (4, 7)
    path = tmp_path / "k.csv"
    kernel_table.write(path, [row], "one row")
    assert kernel_table.load(path) == [row]


def test_joined_kernels_read_back_from_their_csv(tmp_path):
    kernels = [
        traces.JoinedKernel("conv", 2e9, True, 1e6, 1e-4, "", 12, 1),
        traces.JoinedKernel("add", 0.0, False, 4e6, 2e-5, "elementwise", 0, 1),
    ]
    path = str(tmp_path / "k.csv.gz")
    traces.write_csv(path, [("p", "gpu", kernels)])
    assert traces.read_csv(path) == [("p", "gpu", kernels)]
    costs = traces.memory_costs(kernels * 2)
    assert costs.figures["elementwise"] == pytest.approx((2, 4e-5, 8e6))
    fixed, bandwidth = costs.all  # the memory-bound kernels' line through their times
    assert fixed + 4e6 / bandwidth == pytest.approx(2e-5)


def test_suite_rows_and_references_read_from_a_suite_file(tmp_path):
    suite = tmp_path / "suite.py"
    suite.write_text(
        "import ml_collections\n\ndef get_config():\n    c = ml_collections.ConfigDict()\n"
        "    c.base = 'configs/base.py'\n    c.overrides = {}\n"
        "    c.rows = [\n        {'name': 'a', 'config': {'mesh_shape': (1, 1, 1)}, "
        "'reference': 100.0},\n        {'name': 'b', 'config': {}, "
        "'reference_efficiency': 0.5},\n        {'name': 'c', 'config': {}, 'scaling': "
        "'none', 'reference': 0.9},\n    ]\n    return c\n"
    )
    rows = suites.load_rows(None, str(suite), {})
    assert [(name, ref) for name, _, ref in rows] == [
        ("a", suites.Reference(100.0)),
        ("b", suites.Reference(efficiency=0.5)),
        ("c", None),  # a bench row's reference is the accuracy study's, not images/sec
    ]
    spec = suites.load_suite(str(suite))
    entry = suites.SuiteRow.of_record(spec.rows[0])
    assert (entry.name, entry.config, entry.scaling) == ("a", {"mesh_shape": (1, 1, 1)}, None)
    assert suites.row_config(spec, spec.rows[0], {}).num_devices == 1


def test_a_sweep_s_measured_one_device_rows_are_its_calibration_runs(tmp_path):
    rows = [
        {"name": "vgg19 0.25 32 b64", "status": "ok", "num_devices": 1, "images_per_sec": 300.0},
        {"name": "resnet20 1 32 b64", "status": "failed", "num_devices": 1},
        {"name": "not in the suite", "status": "ok", "num_devices": 1, "images_per_sec": 1.0},
    ]
    (tmp_path / "results.json").write_text(json.dumps({"rows": rows}))
    sweep = {"suite": "configs/bench/cpu_models.py", "overrides": {"model.dtype": "bfloat16"}}
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    (run,) = sources.runs_from(str(tmp_path))
    assert (run.name, run.model, run.width, run.batch_size) == (
        "vgg19 0.25 32 b64",
        "vgg19",
        0.25,
        64,
    )
    assert run.dtype == "bfloat16" and run.images_per_sec == 300.0
    assert list(run.as_record())[-2:] == ["images_per_sec", "name"]


def test_a_profile_file_says_what_its_costs_are_fitted_to():
    from jaxpar import configfile
    from jaxpar.predict.profiles.records import ProfileFits

    c = configfile.load("configs/hardware/dgx1_p100.py")
    spec = ProfileFits.of_record(c)
    assert spec.kernel_benchmarks == "configs/hardware/kernels/deepbench_p100.csv"
    assert spec.fit == tuple(c.fit) and spec.kernel_fit == tuple(c.kernel_fit)
    assert spec.calibration is None and spec.price_measured is False
    assert [r.as_record() for r in spec.calibration_runs] == [dict(r) for r in c.calibration_runs]
    assert {r.model for r in spec.calibration_candidates} >= {"inception_v3", "alexnet"}
    bare = ProfileFits.of_record({"name": "p", "fit": None, "kernel_dtype": None})
    assert bare == ProfileFits()  # a key given as None takes its default
