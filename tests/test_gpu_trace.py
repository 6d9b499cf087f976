"""benchmarks/gpu_trace.py on a CPU trace: XLA:CPU names each kernel after the top-level
instruction it runs, so a profiler trace of a compiled program joins with its text."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

spec = importlib.util.spec_from_file_location("gpu_trace", Path("benchmarks/gpu_trace.py"))
gpu_trace = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_trace)


def test_a_cpu_trace_joins_its_convolution_with_its_flops(tmp_path, capsys):
    """A traced program of one 3x3 convolution (8 -> 16 features on 2 x 8 x 8 maps) and a
    ReLU: the trace's kernels name the program's instructions, the convolution's FLOPs are
    2 x its multiply-adds, and the other kernels are memory-bound."""

    def layer(x, w):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))  # fmt: skip
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
    # each memory-bound kernel has its class (gpufusion's rule 8): here all elementwise
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


def test_a_gpu_matrix_kernel_names_its_fewest_rows_or_features(capsys):
    """cuDNN's three kernels of one DenseNet layer (148 features in, 12 out: the lines of an
    H100's program) all have 12 as their fewest rows or features, as opclass reads the CPU's
    program; the trace report then gives each such bucket's rate against the widest one's."""
    ins = {"x": ("f32[64,32,32,148]{3,2,1,0}", "fusion", ""),
           "w": ("f32[12,3,3,148]{3,2,1,0}", "fusion", ""),
           "dy": ("f32[64,32,32,12]{3,2,1,0}", "fusion", "")}  # fmt: skip
    conv = 'window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$conv'
    kernels = {"Forward": ("(f32[64,32,32,12]{3,2,1,0}, u8[0]{0})", "%x, %w"),
               "BackwardInput": ("(f32[64,32,32,148]{3,2,1,0}, u8[0]{0})", "%dy, %w"),
               "BackwardFilter": ("(f32[12,3,3,148]{3,2,1,0}, u8[0]{0})", "%x, %dy")}  # fmt: skip
    for kind, (result, args) in kernels.items():
        rest = f'{args}), {conv}{kind}"'
        assert gpu_trace.matrix_tile(result, rest, ins) == 12, kind
        flops, thin = gpu_trace.matrix_flops(result, rest, ins)
        assert flops == 2 * 64 * 32 * 32 * 148 * 12 * 9 and not thin, kind
    gpu_trace._tiles([("a", 2e9, False, 0, 1e-4, "", 12), ("b", 8e9, False, 0, 1e-4, "", 300)])
    line = capsys.readouterr().out
    assert "16: 1 at 20 TFLOP/s (0.25)" in line and "512: 1 at 80 TFLOP/s (1.00)" in line


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
