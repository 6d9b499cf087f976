"""`python -m jaxpar.predict --calibrate-here`: this machine's device timed into a profile that
loads, reproduces its calibration run and predicts (one tiny row, short timings)."""

from __future__ import annotations

import argparse
import math

import jax
import pytest

from configs import base
from jaxpar.predict import hardware, here, predict_config
from jaxpar.predict.workload import calibration_ops


@pytest.mark.slow  # ~16 s on 2 cores: two compiles of the step, one of the 8-device program
def test_calibrate_here_writes_a_profile_that_loads_fits_and_predicts(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    here.add_arguments(parser)
    bad = parser.parse_args(["--calibrate-here", str(tmp_path / "x.py"), "--here-rows", "vgg9:1:32:float32:8"])  # fmt: skip
    assert here.run(bad) == 2 and "no model 'vgg9'" in capsys.readouterr().err
    nodes = parser.parse_args(["--calibrate-here", str(tmp_path / "x.py"), "--here-devices", "0"])
    assert here.run(nodes) == 2 and "--here-devices must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "x.py").exists()  # refused before anything was timed

    micro = here.microbenchmarks(seconds=0.1)
    assert micro["platform"] == "cpu" and micro["num_devices"] == len(jax.devices()) == 8
    assert 0 < micro["launch_s"] <= micro["sync_call_s"] * 2 and micro["kernel_s"] > 0
    (run,) = here.model_runs(["vgg19:0.125:32:float32:16"], seconds=0.3)
    assert run["images_per_sec"] > 0 and run["image_shape"] == (32, 32, 3)
    path = tmp_path / "here_profile.py"
    report = here.write_profile(str(path), micro, [run], ("compute_efficiency",))
    assert "measured img/s" in report and f"--profile {path}" in report

    profile = hardware.load_profile(path)  # fitted to its one run as it loads
    assert profile.name == "8 x cpu (measured here)" and profile.num_devices == 8
    assert 0 < profile.memory_bandwidth < math.inf
    # the first layer's convolution, timed here, against the matmul's rate
    assert profile.thin_efficiency == micro["thin_conv_float32"] / micro["float32_flops_per_s"] > 0
    assert all(0 < v < math.inf for v in profile.peak_flops.values())
    assert 0 < profile.intra.bandwidth < math.inf and 0 < profile.intra.latency < math.inf
    step = profile.program_time(calibration_ops(run, profile.compiler), run["dtype"])
    step += profile.step_overhead_s + profile.program_overhead_s
    assert abs(run["batch_size"] / step / run["images_per_sec"] - 1) < 0.01

    row = predict_config(base.get_config(), profile)  # 8 simulated devices, data parallel
    assert row["status"] == "ok" and row["num_devices"] == 8 and row["images_per_sec"] > 0


def test_fitting_the_convolutions_rate_on_a_gpu_says_what_it_drops(monkeypatch, capsys):
    """On a GPU the profile's matrix kernels come from kernels timed there; --here-fit
    compute_efficiency alone would price them all at one rate (on an H200 a VGG19 row came
    back 24% slow so): one line says so, and the plan still goes ahead as asked."""
    from types import SimpleNamespace

    monkeypatch.setattr(here.jax, "devices", lambda *a: [SimpleNamespace(platform="gpu")])
    args = SimpleNamespace(here_rows="vgg19:1.0:32:bfloat16:512", here_fit="compute_efficiency",
                           here_seconds=1.0, here_devices=None)  # fmt: skip
    rows, names = here._plan(args)
    assert rows == ["vgg19:1.0:32:bfloat16:512"] and names == ("compute_efficiency",)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: on a GPU") and "kernel_s" in err
    here._plan(SimpleNamespace(**{**vars(args), "here_fit": "kernel_s"}))
    assert capsys.readouterr().err == ""


def test_calibrate_here_traces_its_rows_and_fits_their_memory_bound_kernels(tmp_path):
    """On a GPU --calibrate-here also traces its rows (command buffers off) and fits the
    memory-bound kernels' costs from them, as docs/predict.md's H100 profile was fitted by
    hand. Here on the CPU, whose traces join the same way: a row that cannot run is named,
    every class fitted prices its kernels at their traced total (a least-squares line with a
    fixed cost has residuals summing to zero), and a trace naming too little is not used."""
    from jaxpar.predict import here, traces

    pairs, failed = here.trace_rows(["vgg11:0.125:32:float32:8", "vgg9:1:32:float32:8"],
                                    str(tmp_path))  # fmt: skip
    assert len(pairs) == 1 and len(failed) == 1 and "no model 'vgg9'" in failed[0]
    traced = here.traced_costs(pairs, failed)
    assert traced["named_share"] == 1.0 and traced["not_traced"] == failed  # a CPU's: all named
    assert {"elementwise", "window"} <= set(traced["memory_kernel_costs"])
    assert traced["kernel_s"] >= 0 and traced["memory_bandwidth"] > 0
    rows = [r for r in traces.joined(*pairs[0])[0] if not r[1]]
    assert sum(traced["kernels"].values()) == len(rows)
    for name, (each, bandwidth) in traced["memory_kernel_costs"].items():
        mine = [r for r in rows if r[5] == name]
        if name != "reduce_few":  # priced by bytes per result
            priced = sum(each + r[3] / bandwidth for r in mine)
            assert priced == pytest.approx(sum(r[4] for r in mine), rel=1e-6), name
    skipped = here.traced_costs([])
    assert "skipped" in skipped and "memory_kernel_costs" not in skipped
    here_share = here.NAMED_SHARE
    try:  # a trace that names too little of its time (a GPU's with command buffers on)
        here.NAMED_SHARE = 1.01
        assert "names its instruction" in here.traced_costs(pairs)["skipped"]
    finally:
        here.NAMED_SHARE = here_share
