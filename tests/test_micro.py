"""The microbenchmarks a CPU profile is priced with (jaxpar/predict/calibrate/micro.py): the fit of
narrow_width, and what each benchmark compiles, on tiny sizes (their timings are not checked)."""

from __future__ import annotations

import io

import pytest

from jaxpar import models
from jaxpar.predict.calibrate import micro
from jaxpar.predict.comm import cpulinks
from jaxpar.predict.kernels import opclass
from jaxpar.predict.profiles.calibration_runs import run_config
from jaxpar.predict.profiles.records import CalibrationRun
from jaxpar.predict.programs.workload import input_spec
from jaxpar.predict.step import pipelinehost, pricing


def test_fit_recovers_the_narrow_width_and_the_rate(caplog):
    """Times made with narrow_width 6 and 1e11 FLOP/s give both back (on the grid of 0.25);
    times that no width slows fit 0, the grid's end, which is said."""
    points = []
    for n in (2, 4, 8, 16, 32, 64):
        mm = (opclass.Matmul(1e9, 0.0, False, n), opclass.Matmul(2e9, 0.0, False, 4 * n))
        ops = opclass.OpClasses(matmul_flops=3e9, kernels=2, matmuls=mm)
        seconds = sum(m.flops * (m.narrow + 6) / m.narrow for m in mm) / 1e11
        points.append((ops, seconds))
    d0, rate = micro.fit(points)
    assert d0 == 6.0 and rate == pytest.approx(1e11)
    assert "at its bound" not in caplog.text
    wide = [(ops, ops.matmul_flops / 1e11) for ops, _ in points]  # no width slows a kernel
    assert micro.fit(wide)[0] == 0.0
    assert "narrow_width fitted at its bound (0 of 0 to 64)" in caplog.text


def _timed(monkeypatch, *seconds):
    """timer.measure stubbed: the programs are compiled and read, and each measured call
    takes the next of `seconds` (the timings are the benchmarks' business)."""
    from jaxpar.predict.calibrate import timer

    left = list(seconds)

    def measure(call, budget, **kw):
        s = left.pop(0)
        return timer.Timing(1, (s,), (s,), (s,))

    monkeypatch.setattr(timer, "measure", measure)


def test_narrow_benchmark_reads_a_layers_three_convolutions(monkeypatch):
    """Each width's program is one 3x3 layer's gradient: the forward, input-gradient and
    weight-gradient convolutions, 3 x 2 x 9 x C x width FLOPs per output position, so at 1 ms
    a call its rate is those FLOPs x 1000."""
    _timed(monkeypatch, 1e-3, 1e-3)
    found = micro.measure_narrow(widths=(2, 8), batch=2, side=4, channels=8, seconds=0.0)
    assert set(found.rates) == {2, 8}
    for width in (2, 8):  # 2 images of 4 x 4 positions, 8 input channels
        flops = 3 * 2 * 9 * 8 * width * (2 * 4 * 4)
        assert found.rates[width] == pytest.approx(flops / 1e-3, rel=0.05)
    report = micro.narrow_report(micro.NarrowKernels({2: 1e9, 8: 2.5e9}, 6.0, 1e11))
    assert "2: 1.0, 8: 2.5" in report and "n / (n + 6) of 100.0 GFLOP/s" in report
    assert report.endswith("c.narrow_width = 6")


def test_kernel_benchmark_adds_two_kernels_a_layer(monkeypatch):
    """Each layer of the chain is a product and a tanh, two kernels of XLA:CPU's as opclass
    counts them, so the time the longer chain adds is over two kernels a layer: 4 layers
    more, 8 kernels, taking 40 us more: 5 us a kernel."""
    _timed(monkeypatch, 1e-4, 1.4e-4)
    found = micro.measure_kernel(layers=(2, 6), seconds=0.0)
    assert found.kernels[1] - found.kernels[0] == 8
    assert found.seconds == [1e-4, 1.4e-4] and found.kernel_s == pytest.approx(5e-6)
    assert micro.kernel_report(found).endswith("c.kernel_s = 5e-06")


def test_collective_benchmark_pairs_each_collective_with_local_work_of_its_shape(monkeypatch):
    """Each kind's program has one collective a layer over the devices, of the payload it
    reports (the gathered input, the whole partial sum), and its stand-in none, with the same
    matrix FLOPs: what the pair's CPU times differ by is the collectives. At 5 and 3 CPU-ms a
    call (gather, its copy) and 4 and 3 (psum, local) over 2 layers, a gather costs 1 CPU-ms
    and a psum 0.5: 2 kinds x 1,024 bytes x 2 devices / 1.5 ms = 2.73 MB a CPU-second."""
    for kind, local in (("gather", "copy"), ("psum", "local")):
        ops, texts = [], []
        for k in (kind, local):
            compiled, _, payload = cpulinks.collective_program(k, 4, 2, 4, 8, 3)
            texts.append(compiled.as_text())
            ops.append(opclass.classify(texts[-1]))
        name = "all-gather" if kind == "gather" else "all-reduce"
        starts = [
            line
            for line in texts[0].splitlines()
            if f" {name}(" in line or f" {name}-start(" in line
        ]
        assert len(starts) == 3 and "f32[2,4,4,8]" in starts[0] and payload == 2 * 4 * 4 * 8 * 4
        assert name not in texts[1]
        assert ops[0].flops > 0 and ops[0].flops == pytest.approx(ops[1].flops, rel=1e-6)
    _timed(monkeypatch, 5e-3, 3e-3, 4e-3, 3e-3)
    found = cpulinks.measure_collective_cpu(
        devices=2, batch=2, side=4, channels=8, layers=2, seconds=0.0
    )
    assert found.devices == 2 and found.payload == 2 * 4 * 4 * 8 * 4
    assert found.extra == pytest.approx({"gather": 1e-3, "psum": 0.5e-3})
    assert found.rate == pytest.approx(2 * 1024 * 2 / 1.5e-3)
    assert cpulinks.collective_cpu_report(found).endswith("c.collective_cpu_rate = 2.73e+06")


def test_forward_benchmark_is_the_forward_alone():
    """measure_forward compiles the model's forward only: its convolution and dense FLOPs are
    the model's forward FLOPs, not a training step's three times as many."""
    run = CalibrationRun.of_record(
        {
            "model": "vgg11",
            "width": 0.125,
            "batch_norm": True,
            "head": "auto",
            "dtype": "float32",
            "image_shape": (32, 32, 3),
            "num_classes": 10,
            "batch_size": 2,
        }
    )
    found = micro.measure_forward(run, seconds=0.0)
    config = run_config(run)
    model = models.build(config.model, *input_spec(config))
    assert found.seconds > 0
    assert found.ops.flops == pytest.approx(2 * model.flops_per_example, rel=0.1)


def test_calibrate_pool_fits_with_the_measured_narrow_width(tmp_path, monkeypatch, capsys):
    """`--calibrate RUNS --pool` prices the fit with the narrow_width it measured (runs timed
    by a profile with narrow_width 6 give its matmul rate back only then) and prints the
    forward pass's speedup at the fitted rates. The measurements are stubbed: timing them is
    the benchmarks' business."""
    from jaxpar.predict import __main__ as cli
    from jaxpar.predict.calibrate import from_runs
    from jaxpar.predict.comm import cpulinks
    from jaxpar.predict.profiles import hardware
    from jaxpar.predict.profiles.calibration_runs import calibration_ops
    from jaxpar.predict.step import pipelinehost

    truth = hardware.build(
        "t",
        num_devices=8,
        devices_per_node=8,
        peak_flops={"float32": 1e12},
        memory_bytes=16e9,
        intra=hardware.Link(1e10, 0.0),
        inter=hardware.Link(1e10, 0.0),
        compute_efficiency=0.3,
        kernel_s=20e-6,
        narrow_width=6.0,
    )
    runs = []
    for model, shape, batch in (("lenet", (28, 28, 1), 8), ("vgg11", (32, 32, 3), 16)):
        run = {
            "model": model,
            "width": 0.25,
            "batch_norm": False,
            "image_shape": shape,
            "num_classes": 10,
            "batch_size": batch,
        }
        seconds = pricing.program_time(
            truth, calibration_ops(CalibrationRun.of_record(run)), "float32"
        )
        runs.append({**run, "images_per_sec": batch / seconds})
    (tmp_path / "runs.py").write_text(
        f"import ml_collections\n\ndef get_config():\n    c = ml_collections.ConfigDict()\n"
        f"    c.runs = {runs!r}\n    return c\n"
    )
    (tmp_path / "profile.py").write_text(
        "import ml_collections\n\ndef get_config():\n    c = ml_collections.ConfigDict()\n"
        "    c.name = 'p'\n    c.num_devices = 8\n    c.devices_per_node = 8\n"
        "    c.peak_flops = {'float32': 1e12}\n    c.memory_bytes = 16e9\n"
        "    c.intra = {'bandwidth': 1e10, 'latency': 0.0}\n    c.compute_efficiency = 0.5\n"
        "    return c\n"
    )
    ops = calibration_ops(CalibrationRun.of_record(runs[0]))
    fitted_truth = pricing.device_time(truth, ops, "float32")
    monkeypatch.setattr(from_runs, "measure_pool", lambda run: [])
    monkeypatch.setattr(cpulinks, "measure_links", lambda: None)
    monkeypatch.setattr(cpulinks, "links_report", lambda links: "links: stubbed")
    host = [(k, m, k * 2e-4 + m * (1e-3 + (4 * k - 3) * 5e-5)) for k in (2, 8) for m in (1, 8)]
    monkeypatch.setattr(pipelinehost, "measure_host", lambda run: host)
    monkeypatch.setattr(micro, "measure_narrow", lambda: micro.NarrowKernels({2: 1e9}, 6.0, 1e11))
    monkeypatch.setattr(
        micro,
        "measure_forward",
        lambda run: micro.ForwardPass(ops, fitted_truth / 2, "float32", "lenet"),
    )
    monkeypatch.setattr(
        micro, "measure_kernel", lambda: micro.KernelTime([32, 512], [0.0, 0.0], 20e-6)
    )
    monkeypatch.setattr(
        cpulinks,
        "measure_collective_cpu",
        lambda: cpulinks.CollectiveCpu({"gather": 1e-3}, 10**6, 8, 8e9),
    )
    argv = [
        "--calibrate",
        str(tmp_path / "runs.py"),
        "--profile",
        str(tmp_path / "profile.py"),
        "--fit",
        "compute_efficiency,kernel_s",
        "--pool",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "c.narrow_width = 6" in out and "c.compute_efficiency = 0.3\n" in out
    assert "c.forward_speedup = 2.00" in out
    assert "c.stage_overhead_s = 0.0002; c.stage_device_overhead_s = 0; " in out
    assert "c.microbatch_overhead_s = 0.001; " in out
    # kernel_s left out of --fit: the measured one prices the fit, which gives the rate back
    assert cli.main(argv[:-2] + ["compute_efficiency", "--pool"]) == 0
    out = capsys.readouterr().out
    assert "c.kernel_s = 2e-05" in out and "c.compute_efficiency = 0.3\n" in out
    assert "c.collective_cpu_rate = 8e+09" in out


def test_host_costs_fit_back_and_a_pipeline_costs_more_host_time_per_micro_batch():
    """fit_host gives back the per-stage, per-micro-batch and per-dispatch costs and what
    each further device of a stage adds to the first and last that made the times (never
    below 0); measure_host on a real 2-stage pipeline of a small VGG11 times each layout and
    micro-batch count asked for (measured, so only their signs are checked: a loaded machine
    reorders timings)."""
    costs = {
        "stage_overhead_s": 4e-4,
        "stage_device_overhead_s": 3e-4,
        "microbatch_overhead_s": 1.5e-3,
        "program_overhead_s": 5e-5,
        "program_device_overhead_s": 2e-5,
    }
    points = [
        (k, m, d, pipelinehost.host_seconds(costs, k, m, d, 1e-3))
        for d, k in pipelinehost.LAYOUTS
        for m in (1, 2, 4, 8)
    ]
    assert pipelinehost.fit_host(points, 1e-3) == pytest.approx(costs, rel=1e-6)
    assert points[0][3] == pytest.approx(1e-3 + 2 * 4e-4 + 1.5e-3 + 5 * 5e-5)  # K=2, M=1, D=1
    shrinking = [(k, m, 1e-3 + m * 1e-3 - k * 1e-4) for k, m, d, _ in points if d == 1]
    fitted = pipelinehost.fit_host(shrinking, 1e-3)
    assert fitted["stage_overhead_s"] == 0.0 and min(fitted.values()) >= 0.0
    run = CalibrationRun.of_record(
        {
            "model": "vgg11",
            "width": 0.25,
            "batch_norm": True,
            "head": "auto",
            "dtype": "float32",
            "image_shape": (32, 32, 3),
            "num_classes": 10,
            "batch_size": 8,
        }
    )
    log = io.StringIO()
    (one, four) = pipelinehost.measure_host(
        run, layouts=((1, 2),), microbatches=(1, 4), steps=3, repeats=2, stream=log
    )
    assert (one[:3], four[:3]) == ((2, 1, 1), (2, 4, 1))
    assert one[3] > 0 and four[3] > 0
    lines = log.getvalue().splitlines()  # a line per pipeline, with its figure and the ETA
    assert [x.split(":")[0] for x in lines] == ["  host time 1/2", "  host time 2/2"]
    assert f"K=2 M=4 D=1 {four[3] * 1e3:.2f} ms a step, ETA" in lines[1]
