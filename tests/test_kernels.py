"""Matrix-kernel costs from published per-kernel timings (jaxpar/predict/kernels.py)."""

import dataclasses

import pytest

from jaxpar.errors import ConfigError
from jaxpar.predict import hardware, kernels

GB = 1e9
TABLE = "configs/hardware/kernels/deepbench_p100.csv"


def _gpu(**kw) -> hardware.Profile:
    base = {"name": "gpu", "num_devices": 1, "devices_per_node": 1,
            "peak_flops": {"float32": 10e12}, "memory_bytes": 16 * GB,
            "intra": hardware.Link(10 * GB, 0.0), "inter": hardware.Link(10 * GB, 0.0),
            "compute_efficiency": 0.5, "compiler": "gpu", "memory_bandwidth": 700 * GB}  # fmt: skip
    return hardware.Profile(**{**base, **kw})


def _row(w, h, c, n, k, r, s, pad, stride, times=(1.0, 1.0, 1.0)):
    return dict(zip(kernels._COLUMNS, (w, h, c, n, k, r, s, pad, pad, stride, stride, *times)))


def test_a_convolution_is_read_as_the_compiled_step_reads_it():
    """56x56x64 -> 128, 3x3, stride 1, batch 16: three kernels of 2 x 16 x 56 x 56 x 128 x 64
    x 9 FLOPs, all Winograd (the filter gradient's result is 3x3), narrowest GEMM dimensions
    128 (forward: output features), 64 (input gradient: input features), 128 (filter
    gradient: its output rows are the filters). The same layer with stride 2 is not Winograd,
    and an image's first layer (3 channels) is left out."""
    fwd, grad_in, grad_w = kernels.kernels(_row(56, 56, 64, 16, 128, 3, 3, 1, 1, (1.0, 2.0, 3.0)))
    flops = 2.0 * 16 * 56 * 56 * 128 * 64 * 9
    assert [k.matmul.flops for k in (fwd, grad_in, grad_w)] == [flops] * 3
    assert [k.matmul.winograd for k in (fwd, grad_in, grad_w)] == [True] * 3
    assert [k.matmul.narrow for k in (fwd, grad_in, grad_w)] == [128, 64, 128]
    assert [k.seconds for k in (fwd, grad_in, grad_w)] == [1e-3, 2e-3, 3e-3]
    assert fwd.matmul.moved == 4 * (16 * 56 * 56 * 64 + 16 * 56 * 56 * 128 + 128 * 64 * 9)
    strided = kernels.kernels(_row(56, 56, 64, 16, 128, 3, 3, 1, 2))
    assert strided[0].matmul.flops == 2.0 * 16 * 28 * 28 * 128 * 64 * 9
    assert not any(k.matmul.winograd for k in strided)
    assert kernels.kernels(_row(224, 224, 3, 16, 64, 7, 7, 3, 2)) == []


def test_fit_recovers_the_costs_that_timed_the_kernels():
    """Kernels timed by a known profile (1x1 and strided kernels at 0.6 of peak, 3x3 at 1.5,
    40 us fixed per kernel) give those three costs back from other starting values."""
    truth = _gpu(compute_efficiency=0.6, conv3x3_efficiency=1.5, matmul_kernel_s=40e-6)
    shapes = [(56, 56, 64, 16, 64, 3, 3, 1, 1), (28, 28, 128, 8, 128, 3, 3, 1, 1),
              (14, 14, 256, 16, 1024, 1, 1, 0, 1), (56, 56, 64, 16, 256, 1, 1, 0, 2),
              (7, 7, 512, 8, 2048, 1, 1, 0, 1), (112, 112, 64, 16, 128, 3, 3, 1, 1)]  # fmt: skip
    rows = []
    for shape in shapes:
        row = _row(*shape)
        for column, k in zip(kernels._COLUMNS[-3:], kernels.kernels(row)):
            row[column] = kernels.price(truth, k) * 1e3
        rows.append(row)
    fitted = kernels.fit(_gpu(), rows)
    for name, value in (("compute_efficiency", 0.6), ("conv3x3_efficiency", 1.5),
                        ("matmul_kernel_s", 40e-6)):  # fmt: skip
        assert getattr(fitted.profile, name) == pytest.approx(value, rel=1e-4), name
    assert fitted.median_error < 1e-6 and fitted.total_ratio == pytest.approx(1.0, abs=1e-6)


def test_deepbench_p100_table_prices_its_kernels():
    """The shipped P100 table: 94 published shapes, 252 kernels once first layers are left
    out. Fitted: 1x1 and strided kernels at 0.642 of the float32 peak, Winograd at 1.47, 58 us
    fixed per kernel; a kernel's median error 21.7%, the table's total 0.85 x measured (the
    relative fit weighs the many small kernels as much as the few large ones)."""
    rows = kernels.load(TABLE)
    assert len(rows) == 94
    p100 = _gpu(compute_efficiency=0.4)
    p100 = dataclasses.replace(p100, peak_flops={"float32": 10.6e12},
                               memory_bandwidth=0.9 * 732 * GB)  # fmt: skip
    fitted = kernels.fit(p100, rows)
    assert len(fitted.errors) == 252
    assert fitted.profile.compute_efficiency == pytest.approx(0.642, rel=0.01)
    assert fitted.profile.conv3x3_efficiency == pytest.approx(1.471, rel=0.01)
    assert fitted.profile.matmul_kernel_s == pytest.approx(58e-6, rel=0.02)
    assert fitted.median_error == pytest.approx(0.217, abs=0.005)


def test_a_bad_table_or_profile_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no kernel benchmark table"):
        kernels.load(tmp_path / "none.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("# a comment\nW,H,C\n1,2,3\n")
    with pytest.raises(ConfigError, match="has no column 'N'") as info:
        kernels.load(bad)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="compiler = 'gpu'"):
        kernels.fit(dataclasses.replace(_gpu(), compiler="cpu"), kernels.load(TABLE))
