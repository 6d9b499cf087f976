"""Matrix-kernel costs from published per-kernel timings (jaxpar/predict/kernels/kernel_table.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from jaxpar.errors import ConfigError
from jaxpar.predict.calibrate.records import Microbenchmarks
from jaxpar.predict.kernels import kernel_table, model_layers
from jaxpar.predict.profiles import fitting, hardware
from jaxpar.predict.profiles.records import CalibrationRun
from jaxpar.predict.step import pricing

GB = 1e9
TABLE = "configs/hardware/kernels/deepbench_p100.csv"


def _gpu(**kw) -> hardware.Profile:
    base = {
        "name": "gpu",
        "num_devices": 1,
        "devices_per_node": 1,
        "peak_flops": {"float32": 10e12},
        "memory_bytes": 16 * GB,
        "intra": hardware.Link(10 * GB, 0.0),
        "inter": hardware.Link(10 * GB, 0.0),
        "compute_efficiency": 0.5,
        "compiler": "gpu",
        "memory_bandwidth": 700 * GB,
    }
    return hardware.build(**{**base, **kw})


# a kernel table's columns (DeepBench's convolution shapes, then each kernel's milliseconds)
TIMES = ("forward_ms", "input_grad_ms", "filter_grad_ms")


def _row(w, h, c, n, k, r, s, pad, stride, times=(1.0, 1.0, 1.0)):
    return kernel_table.ConvRow(w, h, c, n, k, r, s, pad, pad, stride, stride, *times)


def _timed(row, profile):
    """The row with each kernel's time as `profile` prices it."""
    ks = kernel_table.kernels(row)
    return dataclasses.replace(
        row, **{c: kernel_table.price(profile, k) * 1e3 for c, k in zip(TIMES, ks)}
    )


def test_a_convolution_is_read_as_the_compiled_step_reads_it():
    """56x56x64 -> 128, 3x3, stride 1, batch 16: three kernels of 2 x 16 x 56 x 56 x 128 x 64
    x 9 FLOPs, all Winograd (the filter gradient's result is 3x3), narrowest GEMM dimensions
    128 (forward: output features), 64 (input gradient: input features), 128 (filter
    gradient: its output rows are the filters). The same layer with stride 2 is not Winograd,
    and an image's first layer (3 channels) is left out."""
    fwd, grad_in, grad_w = kernel_table.kernels(
        _row(56, 56, 64, 16, 128, 3, 3, 1, 1, (1.0, 2.0, 3.0))
    )
    flops = 2.0 * 16 * 56 * 56 * 128 * 64 * 9
    assert [k.matmul.flops for k in (fwd, grad_in, grad_w)] == [flops] * 3
    assert [k.matmul.winograd for k in (fwd, grad_in, grad_w)] == [True] * 3
    assert [k.matmul.narrow for k in (fwd, grad_in, grad_w)] == [128, 64, 128]
    assert [k.seconds for k in (fwd, grad_in, grad_w)] == [1e-3, 2e-3, 3e-3]
    assert fwd.matmul.moved == 4 * (16 * 56 * 56 * 64 + 16 * 56 * 56 * 128 + 128 * 64 * 9)
    strided = kernel_table.kernels(_row(56, 56, 64, 16, 128, 3, 3, 1, 2))
    assert strided[0].matmul.flops == 2.0 * 16 * 28 * 28 * 128 * 64 * 9
    assert not any(k.matmul.winograd for k in strided)
    assert kernel_table.kernels(_row(224, 224, 3, 16, 64, 7, 7, 3, 2)) == []


def test_fit_recovers_the_costs_that_timed_the_kernels():
    """Kernels timed by a known profile (1x1 and strided kernels at 0.6 of peak, 3x3 at 1.5,
    40 us fixed per kernel) give those three costs back from other starting values."""
    truth = _gpu(compute_efficiency=0.6, conv3x3_efficiency=1.5, matmul_kernel_s=40e-6)
    shapes = [
        (56, 56, 64, 16, 64, 3, 3, 1, 1),
        (28, 28, 128, 8, 128, 3, 3, 1, 1),
        (14, 14, 256, 16, 1024, 1, 1, 0, 1),
        (56, 56, 64, 16, 256, 1, 1, 0, 2),
        (7, 7, 512, 8, 2048, 1, 1, 0, 1),
        (112, 112, 64, 16, 128, 3, 3, 1, 1),
    ]
    rows = []
    for shape in shapes:
        rows.append(_timed(_row(*shape), truth))
    fitted = kernel_table.fit(_gpu(), rows)
    for name, value in (
        ("compute_efficiency", 0.6),
        ("conv3x3_efficiency", 1.5),
        ("matmul_kernel_s", 40e-6),
    ):
        assert hardware.value(fitted.profile, name) == pytest.approx(value, rel=1e-4), name
    assert fitted.median_error < 1e-6 and fitted.total_ratio == pytest.approx(1.0, abs=1e-6)


def test_deepbench_p100_table_prices_its_kernels():
    """The shipped P100 table: 94 published shapes, 252 kernels once first layers are left
    out. Fitted: 1x1 and strided kernels at 0.642 of the float32 peak, Winograd at 1.47, 58 us
    fixed per kernel; a kernel's median error 21.7%, the table's total 0.85 x measured (the
    relative fit weighs the many small kernels as much as the few large ones)."""
    rows = kernel_table.load(TABLE)
    assert len(rows) == 94
    p100 = _gpu(compute_efficiency=0.4)
    p100 = hardware.replace(p100, peak_flops={"float32": 10.6e12}, memory_bandwidth=0.9 * 732 * GB)
    fitted = kernel_table.fit(p100, rows)
    assert len(fitted.errors) == 252
    assert fitted.profile.compute.compute_efficiency == pytest.approx(0.642, rel=0.01)
    assert fitted.profile.compute.conv3x3_efficiency == pytest.approx(1.471, rel=0.01)
    assert fitted.profile.kernels.matmul_kernel_s == pytest.approx(58e-6, rel=0.02)
    assert fitted.median_error == pytest.approx(0.217, abs=0.005)


def test_a_bad_table_or_profile_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no kernel benchmark table"):
        kernel_table.load(tmp_path / "none.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("# a comment\nW,H,C\n1,2,3\n")
    with pytest.raises(ConfigError, match="has no column 'N'") as info:
        kernel_table.load(bad)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="compiler = 'gpu'"):
        kernel_table.fit(hardware.replace(_gpu(), compiler="cpu"), kernel_table.load(TABLE))


def test_calibrate_here_on_a_gpu_writes_and_prices_its_own_kernel_table(tmp_path):
    """--calibrate-here on a GPU times the table's image layers (device_rates.time_kernels) and writes
    them beside the profile; the profile loads its matrix kernels' costs from them and fits
    only the per-kernel time to the model row. A GPU's figures stood in for (made by a known
    profile: 0.6 / 1.5 of peak, 40 us a matrix kernel, 3 us a kernel), the CPU compiling."""
    from jaxpar.predict.calibrate import device_rates, on_device, profile_file
    from jaxpar.predict.profiles.calibration_runs import calibration_ops

    micro = Microbenchmarks.of_record(
        {
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
            "peak_memory_bytes": 16e9,  # narrow layers at n / 128 of the wide rate
            "narrow_conv_float32": {n: 8e12 * min(1, n / 128) for n in (8, 16, 64, 128, 256)},
        }
    )
    truth = _gpu(
        peak_flops={"float32": 1e13, "bfloat16": 1e13},
        compute_efficiency=0.6,
        conv3x3_efficiency=1.5,
        matmul_kernel_s=40e-6,
        kernel_s=3e-6,
        thin_efficiency=0.05,
        launch_s=3e-6,
        program_overhead_s=30e-6,
        tile_width=128.0,
    )
    rows = kernel_table.vision_rows(kernel_table.load(kernel_table.SHIPPED))
    assert len(rows) == 24 and all(r.w == r.h and r.c >= 8 for r in rows)
    # what the GPU would run, here on a small shape: three programs, each timed
    (small,) = device_rates.time_kernels([_row(8, 8, 8, 2, 8, 3, 3, 1, 1)], "float32", 0.01)
    assert min(small.forward_ms, small.input_grad_ms, small.filter_grad_ms) > 0
    timed = [_timed(row, truth) for row in rows]
    run = {
        "name": "vgg11:0.125:32:float32:8",
        "model": "vgg11",
        "width": 0.125,
        "batch_norm": True,
        "head": "auto",
        "image_shape": (32, 32, 3),
        "num_classes": 10,
        "dtype": "float32",
        "batch_size": 8,
    }
    run = CalibrationRun.of_record(run)
    step = pricing.program_time(truth, calibration_ops(run), "float32") + 30e-6  # + dispatch
    run = dataclasses.replace(run, images_per_sec=8 / step)
    path = tmp_path / "gpu.py"
    report = profile_file.write_profile(
        str(path), micro, [run], on_device.KERNEL_TABLE_FIT, ("float32", timed)
    )
    assert "gpu_kernels.csv" in report and (tmp_path / "gpu_kernels.csv").is_file()
    p = fitting.load_profile(path)
    assert (
        p.device.compiler == "gpu"
        and p.compute.tile_width == 128.0
        and "tile_width 128" in path.read_text()
    )
    for name, value in (
        ("compute_efficiency", 0.6),
        ("conv3x3_efficiency", 1.5),
        ("matmul_kernel_s", 40e-6),
        ("kernel_s", 3e-6),
    ):
        assert hardware.value(p, name) == pytest.approx(value, rel=2e-3), name
    # and keeps each timed kernel, to price a step's own convolutions of those shapes
    assert (
        sum(map(len, p.kernels.measured_kernels.values())) == 3 * 24
        and p.kernels.measured_dtype == "float32"
    )
    # with the rows' kernel traces (model_runs.traced_costs): the memory-bound kernels' costs and the
    # per-kernel time are the traces', and the rows fit only what a matrix kernel adds
    # inside a step (here the truth's per-class costs are its one kernel_s and bandwidth)
    traced = {
        "rows": ["vgg11_0p125_32_float32_8"],
        "not_traced": [],
        "named_share": 0.97,
        "kernel_s": 3e-6,
        "memory_bandwidth": 7e11,
        "memory_kernel_costs": {
            k: (3e-6, 7e11) for k in ("elementwise", "reduce", "transpose", "window")
        },
    }
    path = tmp_path / "gpu_traced.py"
    with_traces = Microbenchmarks.of_record({**micro.as_record(), "traced": traced})
    profile_file.write_profile(
        str(path), with_traces, [run], on_device.TRACED_FIT, ("float32", timed)
    )
    p = fitting.load_profile(path)
    assert (
        p.memory.memory_kernel_costs == traced["memory_kernel_costs"] and p.kernels.kernel_s == 3e-6
    )
    assert p.kernels.matmul_kernel_s == pytest.approx(40e-6, rel=2e-3)
    assert "kernel traces of vgg11_0p125_32_float32_8" in path.read_text()


def test_calibrate_here_times_the_rows_own_convolution_shapes():
    """Beside DeepBench's image layers, --calibrate-here on a GPU times the convolution shapes
    of its rows' own models computing in the table's dtype (model_layers.model_rows): ResNet-20's
    at batch 8, the most frequent first, none thin, none of another dtype's row."""
    from jaxpar.predict.calibrate import device_rates, model_runs

    rows = ["resnet20:1.0:32:float32:8", "vgg11:0.25:32:bfloat16:8"]
    shapes = device_rates.own_shapes(rows, "float32")
    layers = [f"{r.r}x{r.s} s{r.stride_h} {r.w}x{r.h}x{r.c}->{r.k}" for r in shapes]
    # 3 stages of 3 blocks (16, 32, 64 features on 32, 16, 8 maps): 3x3 stride-1 layers 6 + 5
    # + 5 of them and two stride-2 ones (its shortcuts pad, with no convolution); the
    # 3-channel stem is thin
    assert layers == [
        "3x3 s1 32x32x16->16",
        "3x3 s1 16x16x32->32",
        "3x3 s1 8x8x64->64",
        "3x3 s2 32x32x16->32",
        "3x3 s2 16x16x32->64",
    ]
    assert all(r.c >= 8 and r.n == 8 for r in shapes)
    assert len(device_rates.own_shapes(rows, "float32", limit=2)) == 2
    assert (
        len(device_rates.own_shapes(rows, "bfloat16"))
        == len(model_layers.model_rows(model_runs.parse_row(rows[1]))) - 1
    )  # VGG11's, less its first layer


def test_a_step_s_convolutions_measured_in_the_kernel_table_cost_their_measured_time():
    """A kernel table names each kernel by layer and view (kernel_table.measured), as opclass reads
    a compiled step's convolutions (conv_keys): the forward, input gradient and weight
    gradient of a 3x3 stride-2 layer and of a 1x7 one are all found, and a profile prices
    them at their measured times in the table's dtype (its priced costs in another). The
    same layers at twice the batch (a row whose devices each hold another share of it) cost
    their measured times scaled by their price over the timed kernels'."""
    from jaxpar.predict.kernels import opclass

    def loss(x, w1, w2):
        y = jax.lax.conv_general_dilated(
            x, w1, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        z = jax.lax.conv_general_dilated(
            jnp.sin(y), w2, (1, 1), [(0, 0), (3, 3)], dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jnp.sum(jnp.sin(z))

    def step(batch: int) -> opclass.OpClasses:
        x, w1, w2 = (
            jnp.ones((batch, 17, 17, 16)),
            jnp.ones((3, 3, 16, 32)),
            jnp.ones((1, 7, 32, 24)),
        )
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, w1, w2).compile().as_text()
        ops = opclass.classify(text)  # the matrix kernels alone
        return opclass.OpClasses(
            matmul_flops=ops.matmul_flops, conv3x3_flops=ops.conv3x3_flops, matmuls=ops.matmuls
        )

    four = step(4)
    assert len(four.matmuls) == 6  # x's gradient is asked for: each layer's three kernels
    rows = [
        _row(17, 17, 16, 4, 32, 3, 3, 0, 2, (1.0, 2.0, 3.0)),
        dataclasses.replace(_row(8, 8, 32, 4, 24, 1, 7, 0, 1, (4.0, 5.0, 6.0)), pad_w=3),
    ]
    table = kernel_table.measured(rows)
    timed = {m: next(table[k[1:]] for k in m.keys if k[1:] in table) for m in four.matmuls}
    found = sorted(t[0][1] for t in timed.values())
    assert found == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3])
    priced = _gpu(kernel_s=0.0, matmul_kernel_s=1e-6)
    profile = hardware.replace(priced, measured_kernels=table, measured_dtype="float32")
    assert pricing.device_time(profile, four, "float32") == pytest.approx(21e-3)
    assert pricing.device_time(profile, four, "bfloat16") == pricing.device_time(
        priced, four, "bfloat16"
    )

    def alone(m) -> float:
        return pricing.device_time(
            priced, opclass.OpClasses(matmul_flops=m.flops, matmuls=(m,)), "float32"
        )

    eight = step(8)
    expected = 0.0
    for m in eight.matmuls:
        ((n, seconds, kernel),) = next(table[k[1:]] for k in m.keys if k[1:] in table)
        assert n == 4
        expected += seconds * alone(m) / alone(kernel)
    assert pricing.device_time(profile, eight, "float32") == pytest.approx(expected)
    assert 21e-3 < expected < 2 * 21e-3 + 6 * 1e-6  # twice the work, at most twice the time


def test_a_table_of_a_model_s_own_shapes_names_every_kernel_of_its_step():
    """model_layers.model_rows reads a model's layers from its forward; kernel_table.measured names
    their three kernels each; opclass.conv_keys names the compiled training step's (as the
    GPU program model keeps them): ResNet-20's 19 layers' 56 convolution kernels (three
    each, but for the stem's input gradient, which no step computes) all found but the thin
    stem's two (priced apart: thin_efficiency), its dense layer's three dots none. (At full
    size likewise Inception-v3's 279 of 281 and ResNet-50's 156 of 158: docs/predict.md.)"""
    from jaxpar.predict.calibrate import model_runs
    from jaxpar.predict.profiles.calibration_runs import calibration_ops

    run = model_runs.parse_row("resnet20:1.0:32:float32:8")
    layers = model_layers.model_rows(run)
    rows = [dataclasses.replace(r, **dict.fromkeys(TIMES, 1.0)) for r, _ in layers]
    table = kernel_table.measured(rows)
    ops = calibration_ops(run)
    convs = [m for m in ops.matmuls if m.keys]
    assert sum(n for _, n in layers) == 19 and len(convs) == 3 * 19 - 1
    found = [
        m for m in convs if any(any(n == k[0] for n, _, _ in table.get(k[1:], ())) for k in m.keys)
    ]
    assert len(found) == len(convs) - 2 and all(m.thin for m in convs if m not in found)
    assert len(ops.matmuls) - len(convs) == 3  # the dense layer: forward and two gradients
