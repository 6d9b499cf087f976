"""`python -m jaxpar.predict --calibrate-here`: this machine's device timed into a profile that
loads, reproduces its calibration run and predicts (one tiny row, short timings)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import runpy

import jax
import pytest

from configs import base
from jaxpar.predict import predict_config
from jaxpar.predict.calibrate import device_rates, model_runs, on_device, profile_file
from jaxpar.predict.calibrate.records import Microbenchmarks
from jaxpar.predict.profiles import fitting
from jaxpar.predict.profiles.calibration_runs import calibration_ops
from jaxpar.predict.programs import gputarget
from jaxpar.predict.step import pricing


@pytest.mark.slow  # ~16 s on 2 cores: two compiles of the step, one of the 8-device program
def test_calibrate_here_writes_a_profile_that_loads_fits_and_predicts(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    on_device.add_arguments(parser)
    bad = parser.parse_args(
        ["--calibrate-here", str(tmp_path / "x.py"), "--here-rows", "vgg9:1:32:float32:8"]
    )
    assert on_device.run(bad) == 2 and "no model 'vgg9'" in capsys.readouterr().err
    nodes = parser.parse_args(["--calibrate-here", str(tmp_path / "x.py"), "--here-devices", "0"])
    assert (
        on_device.run(nodes) == 2 and "--here-devices must be at least 1" in capsys.readouterr().err
    )
    assert not (tmp_path / "x.py").exists()  # refused before anything was timed

    micro = device_rates.microbenchmarks(seconds=0.1)
    assert micro.platform == "cpu" and micro.num_devices == len(jax.devices()) == 8
    # measured, so only their signs are checked (a loaded machine reorders them: timings are
    # the benchmarks' business)
    assert micro.launch_s > 0 and micro.sync_call_s > 0 and micro.kernel_s > 0
    (run,) = model_runs.model_runs(["vgg19:0.125:32:float32:16"], seconds=0.3)
    assert run.images_per_sec > 0 and run.image_shape == (32, 32, 3)
    assert micro.thin_conv["float32"] > 0 and micro.flops_per_s["float32"] > 0
    # a first layer's convolution at a quarter of the matmul's rate
    micro = dataclasses.replace(micro, thin_conv={"float32": micro.flops_per_s["float32"] / 4})
    path = tmp_path / "here_profile.py"
    report = profile_file.write_profile(str(path), micro, [run], ("compute_efficiency",))
    assert "measured img/s" in report and f"--profile {path}" in report

    profile = fitting.load_profile(path)  # fitted to its one run as it loads
    assert profile.name == "8 x cpu (measured here)" and profile.device.num_devices == 8
    assert 0 < profile.memory.memory_bandwidth < math.inf
    assert profile.compute.thin_efficiency == pytest.approx(
        0.25
    )  # the first layer's, against a matmul
    assert all(0 < v < math.inf for v in profile.device.peak_flops.values())
    assert (
        0 < profile.links.intra.bandwidth < math.inf and 0 < profile.links.intra.latency < math.inf
    )
    step = pricing.program_time(profile, calibration_ops(run, gputarget.of(profile)), run.dtype)
    step += profile.host.step_overhead_s + profile.host.program_overhead_s
    assert abs(run.batch_size / step / run.images_per_sec - 1) < 0.01

    row = predict_config(base.get_config(), profile)  # 8 simulated devices, data parallel
    assert row.status == "ok" and row.num_devices == 8 and row.images_per_sec > 0


def test_fitting_the_convolutions_rate_on_a_gpu_says_what_it_drops(monkeypatch, capsys):
    """On a GPU the profile's matrix kernels come from kernels timed there; --here-fit
    compute_efficiency alone would price them all at one rate (on an H200 a VGG19 row came
    back 24% slow so): one line says so, and the plan still goes ahead as asked."""
    from types import SimpleNamespace

    monkeypatch.setattr(on_device.jax, "devices", lambda *a: [SimpleNamespace(platform="gpu")])
    timed = []

    def stop(rows, seconds):  # the plan went ahead: stop before anything is timed
        timed.append(rows)
        raise ValueError("stopped here")

    monkeypatch.setattr(
        device_rates, "microbenchmarks", lambda seconds: SimpleNamespace(platform="gpu")
    )
    monkeypatch.setattr(model_runs, "model_runs", stop)
    args = SimpleNamespace(
        calibrate_here="x.py",
        here_rows="vgg19:1.0:32:bfloat16:512",
        here_fit="compute_efficiency",
        here_seconds=1.0,
        here_devices=None,
    )
    assert on_device.run(args) == 2 and timed == [["vgg19:1.0:32:bfloat16:512"]]
    note, stopped = capsys.readouterr().err.splitlines()
    assert note.startswith("note: on a GPU") and "kernel_s" in note and "stopped here" in stopped
    assert on_device.run(SimpleNamespace(**{**vars(args), "here_fit": "kernel_s"})) == 2
    assert "note" not in capsys.readouterr().err and len(timed) == 2


def test_calibrate_here_traces_its_rows_and_fits_their_memory_bound_kernels(tmp_path):
    """On a GPU --calibrate-here also traces its rows (command buffers off) and fits the
    memory-bound kernels' costs from them, as docs/predict.md's H100 profile was fitted by
    hand. Here on the CPU, whose traces join the same way: a row that cannot run is named,
    every class fitted prices its kernels at their traced total (a least-squares line with a
    fixed cost has residuals summing to zero), and a trace naming too little is not used."""
    from jaxpar.predict.calibrate import model_runs, traces

    pairs, failed = model_runs.trace_rows(
        ["vgg11:0.125:32:float32:8", "vgg9:1:32:float32:8"], str(tmp_path)
    )
    assert len(pairs) == 1 and len(failed) == 1 and "no model 'vgg9'" in failed[0]
    traced = model_runs.traced_costs(pairs, failed)
    assert traced.named_share == 1.0 and traced.not_traced == failed  # a CPU's: all named
    assert {"elementwise", "window"} <= set(traced.memory_kernel_costs)
    assert traced.kernel_s >= 0 and traced.memory_bandwidth > 0
    rows = [r for r in traces.joined(*pairs[0]).kernels if not r.flops]
    assert sum(traced.kernels.values()) == len(rows)
    for name, (each, bandwidth) in traced.memory_kernel_costs.items():
        mine = [r for r in rows if r.kind == name]
        if name != "reduce_few":  # priced by bytes per result
            priced = sum(each + r.bytes / bandwidth for r in mine)
            assert priced == pytest.approx(sum(r.seconds for r in mine), rel=1e-6), name
    skipped = model_runs.traced_costs([]).as_record()
    assert "skipped" in skipped and "memory_kernel_costs" not in skipped
    here_share = model_runs.NAMED_SHARE
    try:  # a trace that names too little of its time (a GPU's with command buffers on)
        model_runs.NAMED_SHARE = 1.01
        assert "names its instruction" in model_runs.traced_costs(pairs).skipped
    finally:
        model_runs.NAMED_SHARE = here_share


def test_calibrate_here_s_gpu_path_end_to_end(tmp_path, monkeypatch, capsys):
    """run() as on a GPU, its microbenchmarks and kernel timings stood in for (a known GPU's
    figures), the row timed and traced here: its kernel table holds DeepBench's 24 image
    layers and the row's own convolution shapes, the profile takes the memory-bound costs
    its row's trace gave, its docstring says so, and its rows' fit names matmul_kernel_s."""
    from jaxpar import configfile
    from jaxpar.predict.kernels import kernel_table

    micro = {
        "platform": "gpu",
        "device_kind": "Test GPU",
        "jax": "0",
        "seconds": 0.1,
        "num_devices": 1,
        "matmul_float32": {1024: 1e13},
        "float32_flops_per_s": 1e13,
        "thin_conv_float32": 5e11,
        "matmul_flops_per_s": 1e13,
        "memory_bandwidth_array_bytes": 1 << 30,
        "memory_bandwidth": 7e11,
        "launch_s": 30e-6,
        "sync_call_s": 60e-6,
        "kernel_s": 3e-6,
        "peak_memory_bytes": 16e9,
    }
    truth = fitting.from_config(
        {
            "name": "a GPU",
            "num_devices": 1,
            "devices_per_node": 1,
            "peak_flops": {"float32": 1e13},
            "memory_bytes": 16e9,
            "intra": {"bandwidth": 1e11, "latency": 0.0},
            "compiler": "gpu",
            "compute_efficiency": 0.6,
            "conv3x3_efficiency": 1.5,
            "memory_bandwidth": 7e11,
            "matmul_kernel_s": 40e-6,
        }
    )

    def timed(rows, dtype, seconds):
        columns = ("forward_ms", "input_grad_ms", "filter_grad_ms")
        out = []
        for r in rows:
            ks = kernel_table.kernels(dataclasses.replace(r, **dict.fromkeys(columns, 1.0)))
            priced = {c: kernel_table.price(truth, k) * 1e3 for c, k in zip(columns, ks)}
            out.append(dataclasses.replace(r, **priced))
        return out

    monkeypatch.setattr(
        device_rates, "microbenchmarks", lambda seconds: Microbenchmarks.of_record(micro)
    )
    monkeypatch.setattr(device_rates, "time_kernels", timed)
    parser = argparse.ArgumentParser()
    on_device.add_arguments(parser)
    path = tmp_path / "gpu.py"
    row = "vgg11:0.125:32:float32:8"
    args = parser.parse_args(
        ["--calibrate-here", str(path), "--here-rows", row, "--here-seconds", "0.2"]
    )
    assert on_device.run(args) == 0, capsys.readouterr()
    table = kernel_table.load(profile_file.kernel_table_path(path))
    own = device_rates.own_shapes([row], "float32")
    assert len(own) >= 3 and len(table) == 24 + len(own)
    c = configfile.load(str(path))
    traced = runpy.run_path(str(path))["MEASURED"]["traced"]
    p = fitting.load_profile(path)
    assert tuple(c.fit) == on_device.TRACED_FIT and traced["named_share"] == 1.0
    assert (
        p.memory.memory_kernel_costs == traced["memory_kernel_costs"]
        and "window" in traced["memory_kernel_costs"]
    )  # VGG's max pools
    assert (
        p.kernels.kernel_s == traced["kernel_s"]
        and p.memory.memory_bandwidth == traced["memory_bandwidth"]
    )
    assert "kernel traces of vgg11_0p125_32_float32_8" in path.read_text()
    assert sum(map(len, p.kernels.measured_kernels.values())) == 3 * len(table)  # every kernel kept
