"""The performance model on hand-computable cases (fast: tiny models, no training)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from pathlib import Path
from types import SimpleNamespace

import jax
import pytest

from jaxpar import analysis, run_setup
from jaxpar.config import ConfigError
from jaxpar.parallel import schedules
from jaxpar.predict import PredictedRow, load_profile, predict_config, predict_rows, recommend
from jaxpar.predict.comm import links
from jaxpar.predict.kernels import opclass
from jaxpar.predict.profiles import fitting, hardware
from jaxpar.predict.profiles.records import CalibrationRun
from jaxpar.predict.programs.workload import ChunkCost, StageCost, Workload, workload
from jaxpar.predict.step import pricing
from jaxpar.predict.step.model import predict_workload
from tests import shipped_profiles
from tests.util import tiny_config, tiny_profile

GB = 1e9
PROFILES = sorted(Path("configs/hardware").glob("*.py"))
# Profiles whose loading fits costs to calibration runs, compiling those runs' programs (half a
# minute to a minute each on 2 cores): the extended tier (tests/conftest.py) reproduces the
# CPU models', the DGX-1's kernel-table and the H100's fits in a process of their own, whose
# programs the DGX-1 and H100 tests read too; the default suite loads the others here.
# JAXPAR_TEST_PROFILES=all adds the fits of FITTED_ELSEWHERE (docs/tests.md, "Checks outside
# the suite", says how long that takes).
FITTED = ("cpu_2core_models", "dgx1_p100", "h100_sxm_2nodes_ib", "h100_sxm_x8")
FITTED_ELSEWHERE = ("cpu_2core", "h100_here", "h200_sxm_x8", "k80_pcie")
if os.environ.get("JAXPAR_TEST_PROFILES") != "all":
    PROFILES = [p for p in PROFILES if p.stem not in FITTED_ELSEWHERE]
UNFITTED = [p for p in PROFILES if p.stem not in FITTED + FITTED_ELSEWHERE]


def test_ring_allreduce_time_by_hand():
    # 2 (n-1)/n x bytes / bw + 2 (n-1) x latency: 2*3/4 * 1 GB / 10 GB/s + 6 * 5 us
    link = hardware.Link(bandwidth=10 * GB, latency=5e-6)
    assert links.ring_allreduce_time(1 * GB, 4, link) == pytest.approx(0.15 + 30e-6)
    assert links.ring_allreduce_time(1 * GB, 1, link) == 0.0
    two_rings = hardware.Link(bandwidth=10 * GB, latency=0.0, rings=2)
    assert links.ring_allreduce_time(1 * GB, 4, two_rings) == pytest.approx(0.075)
    # all-gather of a 1 GB result over 4: (n-1)/n of it crosses each device's link
    assert links.allgather_time(1 * GB, 4, hardware.Link(10 * GB, 0.0)) == pytest.approx(0.075)


def test_group_spanning_nodes_is_hierarchical():
    p = tiny_profile(devices_per_node=4)
    mesh = {"data": 8, "stage": 1, "tensor": 1}
    group = links.group_of("data", mesh)
    assert group == list(range(8)) and links.span(group, 4) == (4, 2)
    # in the node: reduce-scatter + all-gather (0.75 GB over 10 GB/s); across: 1/4 of it
    # all-reduced by 2 nodes (2*1/2 * 0.25 GB over 1 GB/s)
    expected = 0.075 + 0.075 + 0.25
    assert links.collective_time("all-reduce", 1 * GB, group, p) == pytest.approx(expected)
    # the tensor axis of a (2,1,4) mesh stays inside a node
    tensor_group = links.group_of("tensor", {"data": 2, "stage": 1, "tensor": 4})
    assert tensor_group == [0, 1, 2, 3] and links.span(tensor_group, 4) == (4, 1)


def test_a_rank_order_ring_over_a_cube_mesh_runs_at_its_unwired_hop():
    # a DGX-1's hybrid cube mesh: each quad wired all to all, GPU i to GPU i + 4; NCCL 1.x's
    # ring over 0..7 in rank order crosses 3 -> 4 and 7 -> 0, which have no NVLink
    cube = [(a, b) for a in range(8) for b in range(a + 1, 8) if a // 4 == b // 4 or b == a + 4]
    p = fitting.from_config(
        {
            "name": "cube",
            "num_devices": 8,
            "devices_per_node": 8,
            "peak_flops": {"float32": 1e12},
            "memory_bytes": 16 * GB,
            "intra": {"bandwidth": 20 * GB, "latency": 0.0},
            "unwired": {"bandwidth": 5 * GB, "latency": 0.0},
            "peers": cube,
            "compute_efficiency": 0.5,
        }
    )
    assert (
        links.ring_link([0, 1, 2, 3], p) == p.links.intra
        and links.ring_link([0, 4], p) == p.links.intra
    )
    assert links.ring_link(list(range(8)), p) == p.links.unwired == hardware.Link(5 * GB, 0.0)
    assert links.ring_link([1, 4], p) == p.links.unwired  # not wired: through the hosts
    # 2 x 3/4 x 1 GB over 20 GB/s in a quad; 2 x 7/8 x 1 GB over 5 GB/s over all eight
    assert links.collective_time("all-reduce", GB, [0, 1, 2, 3], p) == pytest.approx(0.075)
    assert links.collective_time("all-reduce", GB, list(range(8)), p) == pytest.approx(0.35)
    assert (
        links.transfer_link(3, 7, p) == p.links.intra
        and links.transfer_link(3, 4, p) == p.links.unwired
    )
    with pytest.raises(ConfigError, match="go together"):
        fitting.from_config(
            {
                "name": "x",
                "num_devices": 8,
                "devices_per_node": 8,
                "peak_flops": {"float32": 1e12},
                "memory_bytes": GB,
                "intra": {"bandwidth": GB, "latency": 0.0},
                "peers": cube,
                "compute_efficiency": 0.5,
            }
        )
    with pytest.raises(ConfigError, match="not a pair"):
        fitting.from_config(
            {
                "name": "x",
                "num_devices": 8,
                "devices_per_node": 8,
                "peak_flops": {"float32": 1e12},
                "memory_bytes": GB,
                "intra": {"bandwidth": GB, "latency": 0.0},
                "peers": [(0, 8)],
                "unwired": {"bandwidth": GB, "latency": 0.0},
                "compute_efficiency": 0.5,
            }
        )


def test_equal_stages_reproduce_the_analytic_bubble():
    k, m = 4, 8
    line = schedules.timeline(schedules.stage_events("gpipe", k, m), [1.0] * k, [3.0] * k)
    assert line.bubble == pytest.approx(schedules.analytic_bubble(k, m))  # (K-1)/(M+K-1)
    # and through the model: an equal-stage pipeline with free links and no collectives
    # (per call: a forward of 8 images at 1 GFLOP each, a recomputing backward of 3 of those)
    chunks = tuple(
        ChunkCost(s, s, {"fwd": 8e9, "bwd": 24e9, "update": 0.0}, {}, 0) for s in range(k)
    )
    w = Workload(
        "toy",
        {"data": 1, "stage": k, "tensor": 1},
        8 * m,
        "float32",
        1,
        4,
        1,
        "gpipe",
        m,
        tuple(tuple(e) for e in schedules.stage_events("gpipe", k, m)),
        chunks,
        (StageCost(0, 0, 0),) * k,
    )
    row = predict_workload(w, tiny_profile())
    busy = row.compute_s  # one stage: M x (forward + recomputing backward)
    assert row.bubble_s / row.step_time_s == pytest.approx((k - 1) / (m + k - 1))
    assert busy == pytest.approx(m * 4 * 1e9 * 8 / 0.5e12)
    # a forward-only program at the profile's forward_speedup; the recomputing backward as is
    faster = predict_workload(w, tiny_profile(forward_speedup=2.0))
    assert faster.compute_s == pytest.approx(m * (8e9 / 2 + 24e9) / 0.5e12)
    # the runner's host time: per step, per stage, per micro-batch and per program the busiest
    # stage dispatches (a forward and a backward per micro-batch)
    costs = {
        "step_overhead_s": 1e-3,
        "stage_overhead_s": 2e-4,
        "microbatch_overhead_s": 1e-3,
        "program_overhead_s": 5e-5,
    }
    hosted = predict_workload(w, tiny_profile(**costs))
    assert hosted.overhead_s == pytest.approx(1e-3 + k * 2e-4 + m * (1e-3 + 2 * 5e-5))
    # each further device of a stage (here data 2: 2 per stage) adds its per-stage and
    # per-dispatch costs
    wide = dataclasses.replace(w, mesh_shape={"data": 2, "stage": k, "tensor": 1})
    costs = {**costs, "stage_device_overhead_s": 3e-4, "program_device_overhead_s": 2e-5}
    hosted = predict_workload(wide, tiny_profile(**costs))
    assert hosted.overhead_s == pytest.approx(
        1e-3 + k * (2e-4 + 3e-4) + m * (1e-3 + 2 * (5e-5 + 2e-5))
    )


def test_narrow_matrix_kernels_are_priced_by_their_width():
    """On a CPU profile with narrow_width d, a matrix kernel whose narrowest GEMM dimension is
    n takes (n + d) / n times its FLOPs at the class rate; 0 leaves the classes' sums."""
    wide = opclass.Matmul(4e9, 0.0, False, 1 << 30)
    thin = opclass.Matmul(4e9, 0.0, False, 2)
    ops = opclass.OpClasses(matmul_flops=8e9, kernels=2, matmuls=(wide, thin))
    rate = 0.5e12
    assert pricing.device_time(tiny_profile(), ops, "float32") == pytest.approx(8e9 / rate)
    priced = pricing.device_time(tiny_profile(narrow_width=6.0), ops, "float32")
    assert priced == pytest.approx(4e9 / rate * (1 + 6 / (1 << 30)) + 4e9 / rate * (2 + 6) / 2)


def test_a_gpu_prices_a_narrow_layer_by_its_share_of_each_tile():
    """A layer of 12 output features over 40 input features, as XLA:CPU compiles its training
    kernels: the forward's, input gradient's and weight gradient's fewest of rows, input
    features and output features (taps apart) are all 12, although their narrowest GEMM
    dimensions differ (the input gradient sums 12 x 9 products). On a GPU profile with
    tile_width 128 each runs at 12 / 128 of its class's rate; a wide layer at the full rate."""
    import jax.numpy as jnp

    def loss(x, w):
        y = jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jnp.sum(y * y)

    x, w = jnp.ones((4, 8, 8, 40)), jnp.ones((3, 3, 40, 12))
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w).compile().as_text()
    ops = opclass.classify(text)
    assert len(ops.matmuls) == 3 and {m.tile for m in ops.matmuls} == {12}
    assert sorted(m.narrow for m in ops.matmuls) == [12, 12, 40]
    gpu = tiny_profile(compiler="gpu", memory_bandwidth=1e18, tile_width=128.0)
    rate = 1e12 * 0.5
    assert pricing.device_time(gpu, ops, "float32") == pytest.approx(
        ops.memory_bytes / 1e18 + sum(m.flops for m in ops.matmuls) / (rate * 12 / 128)
    )
    wide = opclass.OpClasses(
        matmul_flops=4e9, kernels=1, matmuls=(opclass.Matmul(4e9, 0.0, False, 256, tile=256),)
    )
    assert pricing.device_time(gpu, wide, "float32") == pytest.approx(4e9 / rate)
    # without tile_width the GPU's roofline keeps narrow_width's n / (n + d)
    old = tiny_profile(compiler="gpu", memory_bandwidth=1e18, narrow_width=4.0)
    assert pricing.device_time(old, ops, "float32") == pytest.approx(
        ops.memory_bytes / 1e18
        + sum(m.flops / (rate * m.narrow / (m.narrow + 4.0)) for m in ops.matmuls)
    )
    assert (
        fitting.from_config(
            {
                "name": "t",
                "num_devices": 1,
                "devices_per_node": 1,
                "peak_flops": {"float32": 1e12},
                "memory_bytes": 1e9,
                "intra": {"bandwidth": 1e9, "latency": 0.0},
                "compute_efficiency": 0.5,
                "tile_width": 64,
            }
        ).compute.tile_width
        == 64.0
    )


def test_the_tile_width_fits_the_rates_of_narrow_layers(caplog):
    """here.py's narrow convolutions: rate(n) = r0 x min(1, n / T) recovers T, measured rates
    with noise too (an H100's: configs/hardware/h100_here.py's tile width); a
    width at the grid's end is said."""
    from jaxpar.predict.calibrate import device_rates

    narrow = device_rates.NARROW_FEATURES
    assert device_rates.fit_tile_width({n: 5e14 * min(1.0, n / 64) for n in narrow}) == 64
    h100_bf16 = {8: 51.0, 16: 107.0, 32: 188.7, 64: 370.3, 128: 609.5, 256: 734.3}
    assert device_rates.fit_tile_width(h100_bf16) == 128
    assert "at its bound" not in caplog.text
    assert device_rates.fit_tile_width({n: 1.0 for n in narrow}) == 8  # never narrow
    assert "tile_width fitted at its bound (8 of 8 to 1024)" in caplog.text


def test_memory_over_capacity_does_not_fit():
    config = tiny_config(mesh_shape=(2, 1, 1))
    roomy = predict_config(config, tiny_profile())
    assert roomy.fits and roomy.memory_bytes_per_device > 0
    tight = predict_config(config, tiny_profile(memory_bytes=roomy.memory_bytes_per_device - 1))
    assert not tight.fits
    assert recommend([dataclasses.replace(tight, name="x")]).startswith(
        "recommendation: none: nothing fits"
    )


def test_data_parallel_bytes_are_the_parameter_bytes():
    w = workload(tiny_config(mesh_shape=(4, 1, 1)))
    (grad,) = [c for c in w.chunks[0].collectives["step"] if c.axes == "data"]
    assert grad.kind == "all-reduce"
    assert w.param_bytes <= grad.bytes <= w.param_bytes + 64  # + loss and accuracy scalars


def _efficiency(global_batch: int, profile) -> float:
    """Predicted efficiency of 4 data-parallel devices against one with a quarter the batch."""
    one = tiny_config(mesh_shape=(1, 1, 1), global_batch_size=global_batch // 4)
    four = tiny_config(mesh_shape=(4, 1, 1), global_batch_size=global_batch)
    return predict_rows([one, four], profile)[1].efficiency


def test_data_parallel_efficiency_falls_with_slower_links_and_rises_with_batch():
    fast = tiny_profile(intra=hardware.Link(10 * GB, 1e-5))
    slow = tiny_profile(intra=hardware.Link(0.1 * GB, 1e-5))
    e_fast, e_slow = _efficiency(16, fast), _efficiency(16, slow)
    assert 0 < e_slow < e_fast <= 1.0
    e_big = _efficiency(64, slow)  # 16 images per device instead of 4
    assert e_slow < e_big <= 1.0


def test_overlap_hides_at_most_the_backward():
    config = tiny_config(mesh_shape=(8, 1, 1))
    slow = tiny_profile(intra=hardware.Link(0.01 * GB, 0.0))
    none = predict_config(config, slow, overlap=0.0)
    full = predict_config(config, slow, overlap=1.0)
    backward = none.compute_s * 2 / 3
    assert full.comm_s == pytest.approx(none.comm_s - backward)


# What each shipped profile says, worked out by hand from its file. "allreduce": seconds to
# all-reduce 1 GB over all its devices, 2(n-1)/n x 1 GB / bandwidth + 2(n-1) x latency in one
# node; over two nodes of 8 H100s, reduce-scatter (7 x 1/8 GB) and all-gather (7/8 GB) at 360
# GB/s in the node, 7 x 5 us each, and a 2-node all-reduce of 1/8 GB at 45 GB/s + 2 x 10 us.
# The other keys: costs the file sets (m60_x2's from its published figures), which loading
# and fitting the rest must keep. The fitted costs are not here: a fit's output copied back
# from its last run checks nothing worked out apart from the fit (fitting's own tests fit
# made-up rows with known costs).
PROFILE_FIGURES = {
    "cpu_2core": {
        "allreduce": 1.75 / 4.75 + 14 * 25e-6,
        "narrow_width": 8.0,
        "forward_speedup": 1.34,
        "collective_cpu_rate": 3.0e9,
        "shared_cores": 2,
    },
    "cpu_2core_models": {
        "allreduce": 1.75 / 4.75 + 14 * 25e-6,
        "kernel_s": 0.39e-6,
        "memory_bandwidth": 9.51e9,
        "collective_cpu_rate": 3.0e9,
        "shared_cores": 2,
    },
    "dgx1_p100": {"allreduce": 1.75 / 18 + 14 * 10e-6},
    "gtx1080ti_x2": {
        "allreduce": 1 / 5 + 2 * 20e-6,
        "memory_bandwidth": 0.9 * 484e9,
        "kernel_s": 37e-6,
    },
    "h100_sxm_2nodes_ib": {
        "allreduce": 2 * (0.875 / 360 + 35e-6) + 0.125 / 45 + 20e-6,
        "kernel_s": 2.49e-6,
        "memory_bandwidth": 2.45e12,
        "tile_width": 128,
    },
    # thin_efficiency: 37.4 TFLOP/s of the bfloat16 peak, 989.4 (an H100 SXM's, dense)
    "h100_sxm_x8": {
        "allreduce": 1.75 / 360 + 14 * 5e-6,
        "kernel_s": 2.49e-6,
        "thin_efficiency": 37.4 / 989.4,
        "tile_width": 128,
    },
    "h100_here": {
        "allreduce": 1.75 / 360 + 14 * 5e-6,
        "memory_bandwidth": 2.5e12,
        "kernel_s": 2e-6,
        "thin_efficiency": 0.045,
        "tile_width": 128,
    },
    "h200_sxm_x8": {
        "allreduce": 1.75 / 360 + 14 * 5e-6,
        "memory_bandwidth": 0.9 * 4.8e12,
        "kernel_s": 0.35e-6,
        "launch_s": 9.58e-6,
        "tile_width": 128,
    },
    "k80_pcie": {"allreduce": 1.75 / 4 + 14 * 25e-6},
    # ResNet-50 on an M60 at a P100's efficiency: 219 img/s x 24.30 GFLOP an image / 10.6 TFLOP/s
    "m60_x2": {"allreduce": 1 / 6 + 2 * 30e-6, "compute_efficiency": 219 * 24.30 / 10.6e3},
}


@pytest.fixture(scope="module")
def shipped_dir(tmp_path_factory):
    """tests/shipped_profiles.py's output, from a process of its own: every shipped profile's
    figures as `python -m jaxpar.predict` loads it (fitted where the file says so: its fits
    read programs compiled with XLA:CPU's default fusion emitters, not the suite's faster
    ones) in figures.json, and the H100 fit's held-out run in held_out.json."""
    import subprocess
    import sys

    from tests.util import ROOT, default_compiler_env

    out = tmp_path_factory.mktemp("shipped")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.shipped_profiles",
            str(out / "figures.json"),
            str(out / "held_out.json"),
            "--profiles",
            *(p.stem for p in PROFILES if p not in UNFITTED),
        ],
        cwd=ROOT,
        env=default_compiler_env(),
        capture_output=True,
        text=True,
        timeout=1800,  # its compiles take minutes, more on a loaded machine
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def shipped(shipped_dir) -> dict:
    import json

    return json.loads((shipped_dir / "figures.json").read_text())


@pytest.mark.parametrize("path", UNFITTED, ids=lambda p: p.stem)
def test_profiles_load(path):
    """A shipped profile that fits nothing loads to the figures its file gives."""
    assert_figures(path.stem, shipped_profiles.profile_figures(path))


@pytest.mark.parametrize("path", [p for p in PROFILES if p not in UNFITTED], ids=lambda p: p.stem)
def test_fitted_profiles_load(path, shipped):
    """A shipped profile fitted to its calibration runs (in tests/shipped_profiles.py's
    process) loads to the figures its file gives."""
    assert_figures(path.stem, shipped[path.stem])


def assert_figures(name: str, got: dict) -> None:
    expected = dict(PROFILE_FIGURES[name])
    assert got["allreduce"] == pytest.approx(expected.pop("allreduce"), rel=1e-9)
    for field, value in expected.items():  # to the digits the file gives
        assert got[field] == pytest.approx(value, rel=0.01), field


def test_dgx1_calibration_reproduces_the_one_gpu_figure(shipped):
    """The DGX-1's matrix kernels are priced from DeepBench's P100 kernel timings (kernels.py),
    and only the per-kernel time of whole steps is fitted to tf_cnn_benchmarks' 1-GPU VGG16
    (154 images/sec) and ResNet-50 (219): one cost for two runs. On XLA:GPU's programs for a
    P100 (compiled here, as the prediction reads them, in tests/shipped_profiles.py's process)
    the VGG16 row comes back at 140 (-9%), ResNet-50 at 222 (+1%)."""
    p = SimpleNamespace(**shipped["dgx1_p100"])
    assert shipped["dgx1_vgg16_images_per_sec"] == pytest.approx(139.8, rel=0.02)
    # from the kernel table: Winograd 3x3 convolutions beat the direct-convolution FLOP count
    # (> 1), 1x1 and other convolutions do not; 58 us of each matrix kernel is fixed
    assert p.conv3x3_efficiency == pytest.approx(1.471, rel=0.01)
    assert p.compute_efficiency == pytest.approx(0.642, rel=0.01)
    assert p.matmul_kernel_s == pytest.approx(58e-6, rel=0.02)
    assert 10e-6 < p.kernel_s < 80e-6  # TensorFlow's per-kernel time, fitted to the two runs


def test_unknown_profile_is_one_line():
    with pytest.raises(ConfigError, match="no hardware profile"):
        load_profile("configs/hardware/nope.py")


def test_profile_with_too_few_devices_fails_the_row():
    row = predict_config(
        tiny_config(mesh_shape=(4, 1, 1)), hardware.replace(tiny_profile(), num_devices=2)
    )
    assert row.status == "failed" and "needs 4 devices" in row.error


def test_pipeline_stage_gradients_cross_nodes_in_mesh_order():
    # (data, stage) = (2, 2): device = 2 * data + stage, so with 2 devices per node each
    # stage's data replicas sit on different nodes and its all-reduce takes the slow link.
    config = tiny_config(mesh_shape=(2, 2, 1), **{"pipeline.num_microbatches": 2})
    one_node = predict_config(config, tiny_profile(inter=hardware.Link(0.001 * GB, 0.0)))
    two_nodes = predict_config(
        config, tiny_profile(devices_per_node=2, inter=hardware.Link(0.001 * GB, 0.0))
    )
    assert two_nodes.grad_allreduce_s > 100 * one_node.grad_allreduce_s > 0


# Every schedule the trainer runs, recomputing or storing residuals.
SCHEDULES = [
    ("naive", 1, True),
    ("gpipe", 1, True),
    ("1f1b", 1, True),
    ("1f1b", 1, False),
    ("interleaved", 2, True),
    ("interleaved", 2, False),
    ("zb-h1", 1, False),
]


@pytest.mark.parametrize(
    "schedule,v,remat", SCHEDULES, ids=[f"{s}-v{v}-remat{r}" for s, v, r in SCHEDULES]
)
def test_predictor_follows_every_schedule(schedule, v, remat):
    """The workload's FLOPs per stage are the trainer's compiled programs' own (cost analysis,
    every call of a step), and with equal chunks and free links its timeline bubble is the
    schedule's analytic one."""
    m = 1 if schedule == "naive" else 4
    config = tiny_config(
        mesh_shape=(1, 2, 1),
        global_batch_size=8,
        **{
            "pipeline.schedule": schedule,
            "pipeline.num_microbatches": m,
            "pipeline.virtual_stages": v,
            "pipeline.remat": remat,
        },
    )
    w = workload(config)
    setup = run_setup.setup(config, jax.devices()[:2])  # the trainer's own strategy
    expected = [0.0, 0.0]
    for p in analysis.programs(setup.strategy, 8):
        expected[p.stage] += p.times * analysis.program_flops(p.compiled)
    assert w.stage_flops() == pytest.approx(expected, rel=1e-9) and min(expected) > 0
    split = schedule == "zb-h1"  # F = B = W for zero-bubble; F = 1, B = 2 otherwise
    unit = {"fwd": 1e9, "bwd": 1e9 if split else 2e9, "update": 0.0}
    chunks = tuple(
        dataclasses.replace(
            c,
            flops={**unit, **({"wgt": 1e9} if split else {})},
            collectives={},
            send_bytes=0,
            ops={},
        )
        for c in w.chunks
    )
    row = predict_workload(dataclasses.replace(w, chunks=chunks), tiny_profile())
    assert row.schedule_bubble == pytest.approx(schedules.analytic_bubble(2, m, schedule, v))


SHAPES = {"vgg11": (32, 32, 3), "lenet": (28, 28, 1)}


def _tiny_run(model: str, images_per_sec: float) -> dict:
    return {
        "model": model,
        "width": 0.25,
        "batch_norm": False,
        "image_shape": SHAPES[model],
        "num_classes": 10,
        "batch_size": 16,
        "images_per_sec": images_per_sec,
    }


def _tiny(model: str, **keys):
    return tiny_config(
        **{
            "model.name": model,
            "model.width": 0.25,
            "mesh_shape": (1, 1, 1),
            "data.image_shape": SHAPES[model],
            **keys,
        }
    )


def test_a_model_with_its_own_calibration_run_predicts_at_its_rate():
    """`calibrations` give a model its own efficiency (one VGG16 figure does not tell a
    ResNet's rate): each model's 1-device row comes back at its run's images/sec."""
    p = fitting.from_config(
        {
            "name": "two models",
            "num_devices": 2,
            "devices_per_node": 2,
            "peak_flops": {"float32": 1e12},
            "memory_bytes": 16 * GB,
            "intra": {"bandwidth": 10 * GB, "latency": 0.0},
            "calibration": _tiny_run("vgg11", 500.0),
            "calibrations": [_tiny_run("lenet", 9000.0)],
        }
    )
    rows = []
    for model, want in (("vgg11", 500.0), ("lenet", 9000.0)):
        config = _tiny(model)
        row = predict_config(config, p)
        assert row.images_per_sec == pytest.approx(want, rel=1e-3)
        rows.append((model, config))
    assert (
        pricing.efficiency(p, "lenet")
        != pricing.efficiency(p, "vgg11")
        == p.compute.compute_efficiency
    )
    # speedup is against the 1-device row of the same model
    two = _tiny("lenet", mesh_shape=(2, 1, 1), global_batch_size=32)
    table = predict_rows([*rows, ("lenet 2", two)], p)
    assert table[2].speedup == pytest.approx(table[2].images_per_sec / table[1].images_per_sec)
    # another 1-device row of the same model (another batch) is its own baseline
    bigger = predict_rows([*rows, ("lenet b32", _tiny("lenet", global_batch_size=32))], p)
    assert bigger[2].speedup == 1.0 and bigger[2].efficiency == 1.0


def test_m60_efficiency_is_the_p100_resnet50_fraction_of_peak():
    """configs/hardware/m60_x2.py states its compute efficiency as the P100's ResNet-50 one
    (219 images/sec, the compiled step's FLOPs per image at batch 64): check the figure."""
    from configs.hardware import dgx1_p100, m60_x2
    from jaxpar.predict.profiles.calibration_runs import calibration_flops

    run = next(r for r in dgx1_p100.get_config().calibration_runs if r["model"] == "resnet50")
    per_image = calibration_flops(CalibrationRun.of_record(run)) / run["batch_size"]
    assert per_image == pytest.approx(24.30e9, rel=1e-3)
    assert m60_x2.P100_RESNET50_EFFICIENCY == pytest.approx(219.0 * per_image / 10.6e12, 1e-3)


def test_published_efficiency_sits_beside_the_prediction():
    """A suite row's `reference_efficiency` (seed 003 publishes speedups, not images/sec) is
    shown beside the prediction, in the predict table and in the bench's predicted.md."""
    from jaxpar.bench import predicted
    from jaxpar.predict import PredictedRow, Scaling, with_references
    from jaxpar.predict.__main__ import table
    from jaxpar.suites import Reference
    from tests.util import bench_row

    rows = [
        PredictedRow(
            name=f"m {n}",
            model="m",
            num_devices=n,
            status="ok",
            scaling=Scaling(1.0, eff),
            mesh_shape=(n, 1, 1),
            images_per_sec=100.0,
            step_time_s=0.1,
            compute_s=0.1,
            comm_s=0.0,
            bubble_s=0.0,
            memory_bytes_per_device=2**30,
            fits=True,
        )
        for n, eff in ((1, 1.0), (2, 0.9))
    ]
    rows = with_references(rows, [None, Reference(efficiency=0.587)])
    assert rows[1].reference_efficiency == 0.587 and rows[1].reference_images_per_sec is None
    assert "| - | 58.7% | +31.3 pt |" in table(rows)
    bench = [
        bench_row(
            name="m",
            num_devices=2,
            speedup=1.5,
            predicted_efficiency=eff,
            reference_efficiency=ref,
            predicted_profile="2x M60",
        )
        for eff, ref in zip((None, 0.9), (None, 0.587))
    ]
    md = predicted.predicted_markdown(bench, "configs/hardware/m60_x2.py")
    assert md.startswith("Predicted on 2x M60") and "| 90.0% | 58.7% | +31.3 pt |" in md


def _hlo(fn, *shapes) -> str:
    args = [jax.ShapeDtypeStruct(s, "float32") for s in shapes]
    return jax.jit(fn).lower(*args).compile().as_text()


def test_op_classes_from_compiled_programs():
    """FLOPs of convolutions and dots from their shapes, 3x3 stride-1 ones apart; a strided
    convolution's input gradient counts only the products that are not with inserted zeros;
    elementwise work as the bytes it reads and writes."""
    from jax import lax

    from jaxpar.predict.kernels import opclass

    def conv(stride, k):
        return lambda x, w: lax.conv_general_dilated(
            x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    c3 = opclass.classify(_hlo(conv(1, 3), (2, 8, 8, 4), (3, 3, 4, 16)))
    assert c3.conv3x3_flops == 2 * (2 * 8 * 8 * 16) * (3 * 3 * 4) and c3.matmul_flops == 0
    c1 = opclass.classify(_hlo(conv(1, 1), (2, 8, 8, 4), (1, 1, 4, 16)))
    assert c1.matmul_flops == 2 * (2 * 8 * 8 * 16) * 4 and c1.conv3x3_flops == 0

    # the input gradient of a stride-2 3x3 convolution: as many products as its forward,
    # though XLA writes it as a 3x3 convolution over a 2x-dilated input (3/4 of it zeros)
    def loss(x, w):
        return conv(2, 3)(x, w).sum()

    grad = opclass.classify(_hlo(jax.grad(loss), (2, 8, 8, 4), (3, 3, 4, 16)))
    assert grad.flops == 2 * (2 * 4 * 4 * 16) * (3 * 3 * 4) and grad.conv3x3_flops == 0
    dot = opclass.classify(_hlo(lambda a, b: a @ b, (32, 64), (64, 8)))
    assert dot.matmul_flops == 2 * 32 * 64 * 8 and dot.kernels == 1
    ew = opclass.classify(_hlo(lambda x: x * 2.0 + 1.0, (1000,)))
    assert (ew.flops, ew.memory_bytes, ew.kernels) == (0, 8000, 1)


def test_a_memory_bound_kernel_reads_what_its_result_needs():
    """XLA computes a loop fusion's expression at its result's indices only: an elementwise
    kernel over a slice of a large operand (DenseNet's gradients of a concatenation) reads
    the slice, so its bytes are the slice's and not the operand's (they were 64 x 1024
    floats here, where 64 x 16 are read); a reduction reads all of its operand. Every
    memory-bound kernel of the CPU's program carries its class, as the trace tool names it."""
    import jax.numpy as jnp

    from jaxpar.predict.kernels import opclass

    sliced = opclass.classify(_hlo(lambda x: x[:, :16] * 2.0 + 1.0, (64, 1024)))
    assert (sliced.kernels, sliced.memory_bytes) == (1, 2 * 64 * 16 * 4)
    assert sliced.memory_classes == (("elementwise", 2 * 64 * 16 * 4.0, 1),)
    summed = opclass.classify(_hlo(lambda x: x.sum(1), (64, 1024)))
    assert summed.memory_classes == (("reduce", (64 * 1024 + 64) * 4.0, 1),)
    flipped = opclass.classify(_hlo(lambda x: x.T + 1.0, (64, 1024)))
    assert flipped.memory_classes == (("transpose", 2 * 64 * 1024 * 4.0, 1),)
    # an array written from a scalar: the CPU's generate class, which a CPU profile with its
    # own rate for it prices there (cpu_2core_models.py: XLA:CPU's iotas and broadcasts)
    made = opclass.classify(_hlo(lambda x: jnp.broadcast_to(x, (64, 1024)), ()))
    assert made.memory_classes == (("generate", 64 * 1024 * 4.0 + 4, 1),)
    both = made + sliced
    cpu = tiny_profile(
        compute_efficiency=1.0,
        memory_bandwidth=8e9,
        kernel_s=1e-6,
        memory_kernel_costs={"generate": (0.0, 2e9)},
    )
    assert cpu.device.compiler == "cpu" and pricing.device_time(
        cpu, both, "float32"
    ) == pytest.approx(2 * 64 * 16 * 4 / 8e9 + 1e-6 + (64 * 1024 * 4 + 4) / 2e9)


def test_pool_of_shared_cores():
    p = tiny_profile(compute_pool=((2, 1.2), (8, 1.5)))
    assert [pricing.pool(p, n) for n in (1, 2, 5, 8, 16)] == pytest.approx(
        [1.0, 1.2, 1.35, 1.5, 1.5]
    )
    assert pricing.pool(tiny_profile(compute_pool=2.0), 8) == 2.0
    assert pricing.pool(tiny_profile(), 8) == 8.0
    # measured per kernel size: linear in log size between sizes, flat beyond, the mean
    # without a size; then linear in N as before
    sized = tiny_profile(
        compute_pool=((2, 10e6, 1.4), (2, 40e6, 1.2), (8, 10e6, 1.6), (8, 40e6, 1.5))
    )
    assert pricing.pool(sized, 2, 20e6) == pytest.approx(1.3) and pricing.pool(
        sized, 2, 5e6
    ) == pytest.approx(1.4)
    assert pricing.pool(sized, 2, 80e6) == pytest.approx(1.2) and pricing.pool(
        sized, 2
    ) == pytest.approx(1.3)
    assert pricing.pool(sized, 5, 10e6) == pytest.approx(1.5) and pricing.pool(
        sized, 16, 40e6
    ) == pytest.approx(1.5)


def test_h100_fit_predicts_the_row_it_leaves_out(shipped_dir):
    """configs/hardware/h100_sxm_x8.py fits two costs (the convolutions' fraction of peak,
    the host's time per kernel launched; the device's per kernel and the memory-bound
    kernels' bandwidth are from the H100's kernel trace) to four measured single-GPU rows,
    priced from XLA:GPU's own programs for one H100. Fitted to three of them, it predicts the
    fourth, bfloat16 at batch 128, within 5% of its measured row: launch-bound, and slower
    than float32's row (its program launches more kernels: the casts). Fitted and priced in
    tests/shipped_profiles.py's process, from the programs it compiled for the profile's own
    fit (XLA:GPU's, whatever XLA:CPU's flags)."""
    import json

    held = json.loads((shipped_dir / "held_out.json").read_text())
    assert held["measured_images_per_sec"] == 27_789
    assert held["images_per_sec"] == pytest.approx(27_789, rel=0.05)


def test_parameter_server_permutes_are_priced_on_the_data_axis():
    """A parameter server's collective-permutes carry source-target pairs, not replica groups:
    they are placed on the data axis and priced as point-to-point transfers, not left at 0 s.
    With 4 replicas every gradient goes from each of the 3 workers to the server and every
    parameter back, one transfer at a time: 6 x the parameter bytes over the link, 4 times the
    ring all-reduce's 2 (N-1)/N = 1.5 x."""
    # tiny_config's VGG11 at width 1/16: 3x3 convolutions (kernel and bias) through the
    # channels 64, 128, 256, 256, 512, 512, 512, 512 / 16 from RGB, then 32 -> 10 classes
    channels = (3, 4, 8, 16, 16, 32, 32, 32, 32)
    params = sum(9 * a * b + b for a, b in itertools.pairwise(channels)) + 32 * 10 + 10
    assert params == 36_610
    bandwidth = 0.01 * GB  # free of latency: seconds are bytes / bandwidth
    profile = tiny_profile(intra=hardware.Link(bandwidth, 0.0))
    config = tiny_config(mesh_shape=(4, 1, 1), **{"sync.mode": "parameter_server"})
    row = predict_config(config, profile)
    # besides: the loss and accuracy (2 x 4 bytes) and the noise scale's two squared norms
    # (the replicas' mean of their own, the server's combined one to every replica), all
    # reduced over the 4 replicas
    metrics = {"all-reduce data": 8 + 8}
    assert row.collective_bytes_per_device == {
        "collective-permute data": 6 * 4 * params,
        **metrics,
    }
    assert row.comm_s == pytest.approx((6 * 4 * params + 1.5 * 16) / bandwidth)
    allreduce = predict_config(tiny_config(mesh_shape=(4, 1, 1)), profile)
    # the gradient, the loss, the accuracy and the replicas' mean squared norm (the combined
    # gradient's is taken on every replica after the all-reduce: no bytes)
    assert allreduce.collective_bytes_per_device == {"all-reduce data": 4 * params + 12}
    assert allreduce.comm_s == pytest.approx(1.5 * (4 * params + 12) / bandwidth)


def test_fit_recovers_the_costs_that_made_the_runs(tmp_path):
    """Runs timed by a known profile (matmuls at 0.3 of peak, 20 us per kernel): the fit
    finds those two costs again from other starting values, reproduces every run, and the
    cross-model check (each model from a fit on the other) is exact; `--calibrate FILE`
    reads such runs from a file."""
    from jaxpar.predict.calibrate import from_runs, sources
    from jaxpar.predict.profiles.calibration_runs import calibration_ops

    truth = tiny_profile(compute_efficiency=0.3, kernel_s=20e-6)
    runs = []
    for model, batch in (("lenet", 8), ("lenet", 64), ("vgg11", 16)):
        run = _tiny_run(model, 1.0) | {"batch_size": batch}
        seconds = pricing.program_time(
            truth, calibration_ops(CalibrationRun.of_record(run)), "float32"
        )
        runs.append({**run, "images_per_sec": batch / seconds})
    typed = [CalibrationRun.of_record(r) for r in runs]
    fit = fitting.fit(tiny_profile(), typed, ("compute_efficiency", "kernel_s"))
    assert fit.profile.compute.compute_efficiency == pytest.approx(0.3, rel=1e-3)
    assert fit.profile.kernels.kernel_s == pytest.approx(20e-6, rel=1e-3)
    assert max(abs(r.error) for r in fit.rows) < 1e-4
    cross = from_runs.cross_check(tiny_profile(), typed, ("compute_efficiency", "kernel_s"))
    assert [c.run.model for c in cross] == ["vgg11"]  # lenet's other-model runs: one, too few
    assert abs(cross[0].error) < 1e-3
    path = tmp_path / "runs.py"
    path.write_text(
        f"import ml_collections\n\ndef get_config():\n    c = ml_collections."
        f"ConfigDict()\n    c.runs = {runs!r}\n    return c\n"
    )
    assert sources.runs_from(str(path)) == typed
    with pytest.raises(ConfigError, match="no bench results"):
        sources.runs_from(str(tmp_path))


def test_predict_cli_does_what_its_help_says(tmp_path, monkeypatch, capsys):
    """`python -m jaxpar.predict --help` shows the module's whole description, and the command
    does what it says: `--config.KEY=VALUE` reaches every row of a suite (over the suite's own
    overrides; a row's own keys win), speedup and efficiency are against the 1-device row, the
    table and the recommendation line follow; an unknown key is refused in one line. Only the
    prediction of one config is a stand-in (100 img/s on one device, 90 per device on more)."""
    import jaxpar.predict
    from jaxpar.predict import __main__ as predict_main

    with pytest.raises(SystemExit) as info:
        predict_main.main(["--help"])
    assert info.value.code == 0
    description = predict_main.__doc__.split("\n\n", 1)[1]  # all of it but the usage line
    assert " ".join(description.split()) in " ".join(capsys.readouterr().out.split())

    seen = []

    def one_config(config, profile, overlap=None):
        n = math.prod(config.mesh_shape)
        seen.append((config.model.width, config.global_batch_size, tuple(config.mesh_shape)))
        rate = 100.0 if n == 1 else 90.0 * n
        step = config.global_batch_size / rate
        return PredictedRow(
            status="ok",
            model=config.model.name,
            num_devices=n,
            mesh_shape=tuple(config.mesh_shape),
            images_per_sec=rate,
            step_time_s=step,
            compute_s=step,
            comm_s=0.0,
            bubble_s=0.0,
            memory_bytes_per_device=2**30,
            memory_capacity_bytes=profile.device.memory_bytes,
            fits=True,
        )

    monkeypatch.setattr(jaxpar.predict, "predict_config", one_config)
    suite = tmp_path / "suite.py"
    suite.write_text(
        "from configs.bench import row, suite\n\n\ndef get_config():\n"
        "    return suite('configs/base.py', {'model.name': 'vgg11', 'global_batch_size': 32}, [\n"
        "        row('1 device', {'mesh_shape': (1, 1, 1)}),\n"
        "        row('data 2', {'mesh_shape': (2, 1, 1)}),\n"
        "        row('data 2 b64', {'mesh_shape': (2, 1, 1), 'global_batch_size': 64})])\n"
    )
    profile = "configs/hardware/gtx1080ti_x2.py"
    args = [
        "--profile",
        profile,
        "--suite",
        str(suite),
        "--config.model.width=0.125",
        "--config.global_batch_size=16",
    ]
    assert predict_main.main(args) == 0
    assert seen == [(0.125, 16, (1, 1, 1)), (0.125, 16, (2, 1, 1)), (0.125, 64, (2, 1, 1))]
    out, err = capsys.readouterr()
    # progress on stderr, a line a row: stdout stays the table
    assert [line.split(":")[0] for line in err.splitlines()] == [
        "predicted 1/3 1 device",
        "predicted 2/3 data 2",
        "predicted 3/3 data 2 b64",
    ]
    assert "predicted 1/3" not in out
    # 180 img/s on 2 devices against 100 on one: speedup 1.8, efficiency 90%
    assert "| data 2 | (2, 1, 1) | 180.0 | 1.80 | 90.0% |" in out
    assert "| 1 device | (1, 1, 1) | 100.0 | 1.00 | 100.0% |" in out
    assert out.rstrip().splitlines()[-1].startswith("recommendation: data 2: 180 img/s")
    assert predict_main.main([*args, "--config.model.widht=0.5"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: unknown config key 'model.widht'"), line


def test_an_in_step_collective_also_costs_the_cores_the_devices_share():
    """On a profile whose devices share cores (this CPU's: collective_cpu_rate, shared_cores),
    a collective inside the step costs its link price plus its payload x the mesh's devices
    / (cores x rate), 8 x 1 MB / (2 x 2 GB/s) = 2 ms here; the gradient's all-reduce over
    data and a profile of devices with cores of their own pay the link price alone."""
    from jaxpar.predict.comm import commtime
    from jaxpar.predict.programs.workload import Collective

    own = hardware.build(
        "p",
        num_devices=8,
        devices_per_node=8,
        peak_flops={"float32": 1e12},
        memory_bytes=16e9,
        intra=hardware.Link(1e10, 1e-5),
        inter=hardware.Link(1e10, 1e-5),
        compute_efficiency=0.5,
    )
    shared = hardware.replace(own, collective_cpu_rate=2e9, shared_cores=2)
    mesh = {"data": 2, "stage": 1, "tensor": 4}
    gather = Collective("all-gather", "tensor", 1, 10**6)
    link = commtime.collectives_time([gather], mesh, own)
    with_cores = commtime.collectives_time([gather], mesh, shared)
    assert link > 0 and with_cores == pytest.approx(link + 2e-3)
    grad = Collective("all-reduce", "data", 1, 10**6)
    grad_shared = commtime.collectives_time([grad], mesh, shared)
    assert grad_shared == commtime.collectives_time([grad], mesh, own) > 0
    assert pricing.shared_core_time(shared, 10**6, 8) == pytest.approx(2e-3)
    assert pricing.shared_core_time(own, 10**6, 8) == 0.0


def test_predict_cli_refuses_one_config_in_one_line(capsys):
    """One config the trainer would refuse: its one line and status 2, not a table of one
    failed row (a suite keeps its table: the other rows are worth seeing)."""
    from jaxpar.predict import __main__ as predict_main

    args = [
        "--profile",
        "configs/hardware/gtx1080ti_x2.py",
        "--config",
        "configs/vgg19_data.py",
        "--config.mesh_shape=(2,1,1)",
        "--config.global_batch_size=7",
    ]
    assert predict_main.main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "error: global_batch_size 7 is not divisible by the data axis "
        "(2 replicas); use a multiple of 2\n"
    )


def test_overlap_as_the_program_schedules_it_and_the_loader_cap():
    """overlap None: gradients sent from where each is ready in the compiled program hide
    some of the all-reduce, never more than a full overlap; a loader slower than the step
    caps the rate at the loader's and says the row is input-bound."""
    config = tiny_config(mesh_shape=(8, 1, 1))
    slow = tiny_profile(intra=hardware.Link(0.01 * GB, 0.0))
    none = predict_config(config, slow, overlap=0.0)
    program = predict_config(config, hardware.replace(slow, overlap=None))
    full = predict_config(config, slow, overlap=1.0)
    assert full.comm_s <= program.comm_s < none.comm_s
    rate = none.images_per_sec / 2
    capped = predict_config(config, hardware.replace(slow, overlap=0.0, loader_images_per_sec=rate))
    assert capped.input_bound and capped.images_per_sec == pytest.approx(rate)
    assert not none.input_bound
