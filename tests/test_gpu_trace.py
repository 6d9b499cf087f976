"""benchmarks/gpu_trace.py on a CPU trace: XLA:CPU names each kernel after the top-level
instruction it runs, so a profiler trace of a compiled program joins with its text."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jaxpar import hlo
from jaxpar.predict.kernels import library

spec = importlib.util.spec_from_file_location("gpu_trace", Path("benchmarks/gpu_trace.py"))
gpu_trace = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_trace)


def test_a_cpu_trace_joins_its_convolution_with_its_flops(tmp_path, capsys):
    """A traced program of one 3x3 convolution (8 -> 16 features on 2 x 8 x 8 maps) and a
    ReLU: the trace's kernels name the program's instructions, the convolution's FLOPs are
    2 x its multiply-adds, and the other kernels are memory-bound."""

    def layer(x, w):
        y = jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jnp.maximum(y, 0.0) * 2.0

    x, w = jnp.ones((2, 8, 8, 8)), jnp.ones((3, 3, 8, 16))
    compiled = jax.jit(layer).lower(x, w).compile()
    with gzip.open(tmp_path / "step.hlo.txt.gz", "wt") as f:
        f.write(compiled.as_text())
    jax.block_until_ready(compiled(x, w))
    with jax.profiler.trace(str(tmp_path / "trace")):
        for _ in range(2):
            jax.block_until_ready(compiled(x, w))
    assert gpu_trace.main([str(tmp_path / "trace"), str(tmp_path / "step.hlo.txt.gz")]) == 0
    out = capsys.readouterr().out
    assert "of CPU kernels a step (2 step(s) traced); 0.00 ms in kernels naming no" in out
    flops = 2 * 2 * 8 * 8 * 16 * 9 * 8
    matrix = next(line for line in out.splitlines() if line.strip().startswith("matrix:"))
    assert int(matrix.split()[1]) == 1
    assert float(matrix.split()[5]) == pytest.approx(flops / 1e9, abs=5e-4)
    assert "memory-bound:" in out
    # each memory-bound kernel has its class (opclass.memory_class): here all elementwise
    classes = [line.split() for line in out.splitlines() if line.strip().startswith("elementwise:")]
    assert len(classes) == 1 and int(classes[0][1]) >= 1
    # two rows (the same one twice): each reported, then their kernels' classes fitted together
    pair = [str(tmp_path / "trace"), str(tmp_path / "step.hlo.txt.gz")]
    assert gpu_trace.main(pair + pair) == 0
    both = capsys.readouterr().out.split("== all 2 rows together")[1]
    line = next(x.split() for x in both.splitlines() if x.strip().startswith("elementwise:"))
    assert int(line[1]) == 2 * int(classes[0][1])
    with pytest.raises(SystemExit):  # a trace without its program
        gpu_trace.main(pair + pair[:1])
    # the joined kernels kept as a table, and fitted from it as from the traces
    table = str(tmp_path / "kernels.csv.gz")
    assert gpu_trace.main(pair + ["--top", "0", "--csv", table]) == 0
    matrix_line = next(x for x in capsys.readouterr().out.splitlines() if "matrix:" in x)
    assert gpu_trace.main(["--from-csv", table, table]) == 0
    out = capsys.readouterr().out
    assert matrix_line in out  # each program's report as its trace gave it
    assert out.split("== all 2 rows together")[1] == both  # and the class fits the same


def report(tmp_path, rows: list[tuple], capsys) -> str:
    """gpu_trace's report of one GPU program's joined kernels, kept as a --csv table."""
    gpu_trace.write_csv(str(tmp_path / "kernels.csv"), [("p", "gpu", rows)])
    assert gpu_trace.main(["--from-csv", str(tmp_path / "kernels.csv"), "--top", "0"]) == 0
    return capsys.readouterr().out


def test_a_gpu_matrix_kernel_names_its_fewest_rows_or_features(tmp_path, capsys):
    """cuDNN's three kernels of one DenseNet layer (148 features in, 12 out: the lines of an
    H100's program) all have 12 as their fewest rows or features, as opclass reads the CPU's
    program; the trace report then gives each such bucket's rate against the widest one's."""
    types = {
        "x": "f32[64,32,32,148]{3,2,1,0}",
        "w": "f32[12,3,3,148]{3,2,1,0}",
        "dy": "f32[64,32,32,12]{3,2,1,0}",
    }
    conv = 'window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$conv'
    kernels = {
        "Forward": ("(f32[64,32,32,12]{3,2,1,0}, u8[0]{0})", "%x, %w"),
        "BackwardInput": ("(f32[64,32,32,148]{3,2,1,0}, u8[0]{0})", "%dy, %w"),
        "BackwardFilter": ("(f32[12,3,3,148]{3,2,1,0}, u8[0]{0})", "%x, %dy"),
    }
    for kind, (result, args) in kernels.items():
        rest = f'{args}), {conv}{kind}"'
        call = library.library_matmul(hlo.Instruction("c", result, "custom-call", rest), types)
        assert call.tile == 12, kind
        assert call.flops == 2 * 64 * 32 * 32 * 148 * 12 * 9 and not call.thin, kind
    matrix = [("a", 2e9, False, 0, 1e-4, "", 12, 1), ("b", 8e9, False, 0, 1e-4, "", 300, 1)]
    copy = ("c", 0.0, False, 1e6, 1e-5, "elementwise", 0, 1)  # the report's memory-bound part
    line = report(tmp_path, [*matrix, copy], capsys)
    assert "16: 1 at 20 TFLOP/s (0.25)" in line and "512: 1 at 80 TFLOP/s (1.00)" in line


FEW = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%few (p: bf16[4096,192]) -> f32[192] {
  %p = bf16[4096,192]{1,0} parameter(0)
  %c = f32[4096,192]{1,0} convert(%p)
  %z = f32[] constant(0)
  ROOT %r = f32[192]{0} reduce(%c, %z), dimensions={0}, to_apply=%add
}

%many (p: f32[4096,2048]) -> f32[2048] {
  %p = f32[4096,2048]{1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[2048]{0} reduce(%p, %z), dimensions={0}, to_apply=%add
}

%short (p: f32[128,192]) -> f32[192] {
  %p = f32[128,192]{1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[192]{0} reduce(%p, %z), dimensions={0}, to_apply=%add
}

ENTRY %main (x: bf16[4096,192], y: f32[4096,2048], s: f32[128,192]) -> f32[192] {
  %x = bf16[4096,192]{1,0} parameter(0)
  %y = f32[4096,2048]{1,0} parameter(1)
  %s = f32[128,192]{1,0} parameter(2)
  %input_reduce_fusion = f32[192]{0} fusion(%x), kind=kInput, calls=%few
  %input_reduce_fusion.1 = f32[2048]{0} fusion(%y), kind=kInput, calls=%many
  ROOT %input_reduce_fusion.2 = f32[192]{0} fusion(%s), kind=kInput, calls=%short
}
"""


def test_a_traced_reduction_into_few_results_is_named_so(tmp_path, capsys):
    """A GPU program's reduction kernels by their largest reduction (opclass's reduce_few):
    Inception-v3's 8x8 BatchNorm statistics (4,096 bfloat16 rows into 192 results) are
    reduce_few, into 2,048 results or summing 128 elements each plain reduce; the trace
    report fits reduce_few's costs on its bytes per result."""
    from jaxpar import hlo

    comps = hlo.parse(FEW)
    kinds = [
        gpu_trace.kernel_class(n, comps)
        for n in ("input_reduce_fusion", "input_reduce_fusion.1", "input_reduce_fusion.2")
    ]
    assert kinds == ["reduce_few", "reduce", "reduce"]
    assert gpu_trace.largest_reduction("input_reduce_fusion", comps) == (
        4096 * 192,
        192,
        4096,
        False,
    )
    # the same sums laid out [192, 4096] and summed along the minor dimension: a row reduction
    row = FEW.replace("bf16[4096,192]", "bf16[192,4096]").replace("f32[4096,192]", "f32[192,4096]")
    row = row.replace("reduce(%c, %z), dimensions={0}", "reduce(%c, %z), dimensions={1}")
    assert gpu_trace.kernel_class("input_reduce_fusion", hlo.parse(row)) == "reduce"
    # two reduce_few kernels of 192 results at 1 us + bytes per result / 1 GB/s
    mem = [("k", 0.0, False, b, 1e-6 + b / 192 / 1e9, "reduce_few", 0, 192) for b in (1e6, 3e6)]
    line = next(x for x in report(tmp_path, mem, capsys).splitlines() if "reduce_few:" in x)
    assert "fit  1.00 us + bytes per result /  1.00 GB/s" in line


def test_the_reduction_microbenchmark_runs_and_reads_its_kernels(tmp_path, capsys):
    """benchmarks/reduce_micro.py (for the next lent GPU) on this CPU: each tiny shape's
    statistics program traced, its kernels joined by name, its length and bytes as computed."""
    import json

    where = importlib.util.spec_from_file_location(
        "reduce_micro", Path("benchmarks/reduce_micro.py")
    )
    reduce_micro = importlib.util.module_from_spec(where)
    where.loader.exec_module(reduce_micro)

    out = tmp_path / "reduce.json"
    assert reduce_micro.main(["--small", "--dtypes", "float32", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["length"], r["results"]) for r in rows] == [(32, 8), (128, 16), (256, 12)]
    assert all(r["kernels"] >= 1 and r["seconds"] > 0 and r["device"] == "cpu" for r in rows)
    assert rows[2]["bytes"] == 4 * 4 * 8 * 8 * 12 + 2 * 4 * 12
    assert "us + bytes /" in capsys.readouterr().out
    # the lane fit (rule 9) recovers 2 us + bytes per result / 1.5 GB/s from exact rows
    synthetic = [
        {"bytes": b, "results": n, "seconds": 2e-6 + b / n / 1.5e9}
        for b, n in ((1e6, 192), (4e6, 384), (2e6, 96))
    ]
    fixed, lane = reduce_micro.fit_lanes(synthetic)
    assert fixed == pytest.approx(2e-6) and lane == pytest.approx(1.5e9)


def test_the_window_microbenchmark_runs_and_splits_its_time(tmp_path):
    """benchmarks/window_micro.py (for the next lent GPU) on this CPU: each pooling case's
    forward and gradient traced, the window kernels' time a part of the whole, the bytes the
    layer must move as computed."""
    import json

    where = importlib.util.spec_from_file_location(
        "window_micro", Path("benchmarks/window_micro.py")
    )
    window_micro = importlib.util.module_from_spec(where)
    where.loader.exec_module(window_micro)

    out = tmp_path / "window.json"
    assert window_micro.main(["--small", "--dtypes", "float32", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["pool"], r["window"], r["stride"]) for r in rows[::2]] == window_micro.CASES
    assert all(0 < r["window_seconds"] <= r["seconds"] and r["kernels"] >= 1 for r in rows)
    # 2 x 8 x 8 x 8 float32 in, its 4 x 4 pooled map out (stride 2), forward and gradient
    assert rows[0]["bytes"] == 2 * (2 * 8 * 8 * 8 * 4) + 2 * (2 * 4 * 4 * 8 * 4)


def test_the_convolution_microbenchmark_reads_a_models_layers_and_prices_each(tmp_path):
    """benchmarks/conv_micro.py (for the next lent GPU) on this CPU: Inception-v3's 94
    convolutions read from its forward as 43 shapes (34 layers of 1x7, 7x1, 1x3 or 3x1); one
    small 1x7 shape's three kernels timed from a trace, within their programs' time, priced
    by a profile as kernel_table.py prices a table's kernel, and written as a kernel table."""
    from jaxpar.predict.calibrate import model_runs
    from jaxpar.predict.kernels import kernel_table, model_layers
    from jaxpar.predict.profiles import fitting

    where = importlib.util.spec_from_file_location("conv_micro", Path("benchmarks/conv_micro.py"))
    conv_micro = importlib.util.module_from_spec(where)
    where.loader.exec_module(conv_micro)

    shapes = model_layers.model_rows(model_runs.parse_row("inception_v3:1:299:float32:64"))
    assert (len(shapes), sum(n for _, n in shapes)) == (43, 94)
    groups = {}
    for row, n in shapes:
        groups[conv_micro.group(row)] = groups.get(conv_micro.group(row), 0) + n
    assert groups == {
        "1x1": 40,
        "1xN / Nx1": 34,
        "3x3 stride 1": 12,
        "5x5 stride 1": 3,
        "strided": 5,
    }
    wanted = (1, 7, 17, 192, 192, 64)  # 1x7, 17x17x192 -> 192 features, batch 64
    seven, layers = next((r, n) for r, n in shapes if (r.r, r.s, r.h, r.c, r.k, r.n) == wanted)
    # SAME: 3 columns each side
    assert (layers, seven.pad_h, seven.pad_w) == (4, 0, 3)

    small = kernel_table.ConvRow(6, 6, 8, 2, 16, 1, 7, pad_h=0, pad_w=3, stride_h=1, stride_w=1)
    timed = conv_micro.measure(small, "float32", calls=2)
    for _, column in conv_micro.KINDS:
        assert 0 < timed[column] <= timed[column.replace("_ms", "_all_ms")]
    profile = fitting.from_config(
        {
            "name": "a GPU",
            "num_devices": 1,
            "devices_per_node": 1,
            "peak_flops": {"float32": 1e12},
            "memory_bytes": 1e9,
            "intra": {"bandwidth": 1e9, "latency": 0.0},
            "compiler": "gpu",
            "compute_efficiency": 0.5,
            "memory_bandwidth": 1e11,
            "matmul_kernel_s": 1e-6,
        }
    )
    lines = conv_micro.compare([timed], [3], profile, "float32")
    # 2 x 6x6 outputs x 16 features x 8 x 7 products: 64,512 FLOPs at 0.5 TFLOP/s, or
    # (2x6x6x8 + 2x6x6x16 + 7x8x16) x 4 bytes at 100 GB/s (longer), plus 1 us
    flops, moved = 2.0 * 2 * 36 * 16 * 8 * 7, 4.0 * (576 + 1152 + 896)
    assert all(
        line["priced_s"] == pytest.approx(1e-6 + max(flops / 0.5e12, moved / 1e11))
        for line in lines
    )
    measured, priced, count = conv_micro.summary(lines)["1xN / Nx1"]
    assert count == 9 and measured == pytest.approx(
        3e-3 * sum(timed[c] for _, c in conv_micro.KINDS)
    )
    assert priced == pytest.approx(9 * lines[0]["priced_s"])

    table = tmp_path / "kernels.csv"
    kernel_table.write(table, [kernel_table.ConvRow.of_record(timed)], "one shape")
    (back,) = kernel_table.load(table)
    assert back.s == 7 and back.forward_ms == pytest.approx(timed["forward_ms"], rel=1e-3)
