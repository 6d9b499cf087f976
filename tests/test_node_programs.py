"""The node axis' compiled programs beside the other axes (issue 57): node costs what data
costs plus its two-level gradient sum, and nothing else. Read from the compiled step on
8 simulated devices (VGG11 at width 1/16, BatchNorm on): beside tensor (and a pipeline)
node alone compiles data's program collective for collective; beside data and tensor the
gradient is one reduce-scatter, all-reduce over node and all-gather of each device's own
tensor shards, and every collective over tensor is data x tensor's. The partitioned steps
compute the single-device function (sync.mode allreduce and sharded)."""

from __future__ import annotations

import math

import jax
import pytest

from jaxpar import analysis, run_setup
from tests.test_axes import FLOAT64, RTOL64, assert_equal, mesh_config
from tests.util import reference_run, run_steps

TENSOR = {"tensor.rules": (("conv_out", "tensor"), ("mlp", "tensor"))}
PIPELINE = {"pipeline.schedule": "1f1b", "pipeline.num_microbatches": 2}


def collectives(names, sizes, **extra) -> tuple[dict, object]:
    """{(program, kind, mesh axes): (count, bytes per device per step)} of the compiled
    programs, and the strategy."""
    setup = run_setup.setup(mesh_config(names, sizes, **TENSOR, **extra), jax.devices())
    rows = analysis.report(setup.strategy, 16, timing=False)["collectives"]
    return {(r[0], r[1], r[2]): (r[3], r[4]) for r in rows}, setup.strategy


def renamed(rows: dict, old: str, new: str) -> dict:
    """`rows` with mesh axis `old` spelled `new`."""
    swap = lambda axes: "+".join(new if a == old else a for a in axes.split("+"))
    return {(where, kind, swap(axes)): v for (where, kind, axes), v in rows.items()}


@pytest.mark.parametrize(
    "rest,sizes,extra",
    [(("tensor",), (2, 4), {}), (("stage", "tensor"), (2, 2, 2), PIPELINE)],
    ids=["tensor", "stage-tensor"],
)
def test_node_alone_beside_tensor_compiles_data_s_program(rest, sizes, extra):
    """With no batch axis inside it, node's gradient mean is one all-reduce over node, as
    data's over data: the same collectives, counts and bytes (not one flat buffer of the
    leaves, which GSPMD would gather over tensor and permute back)."""
    node, _ = collectives(("node", *rest), sizes, **extra)
    data, _ = collectives(("data", *rest), sizes, **extra)
    assert node == renamed(data, "data", "node")
    assert not any(kind == "collective-permute" for _, kind, _ in node)


def test_node_beside_data_and_tensor_adds_only_the_two_level_sum():
    """(node, data, tensor) = (2, 2, 2) beside (data, tensor) = (4, 2): every collective over
    tensor (and the optimizer's over every axis) is the same; the gradient, one buffer of
    each device's own tensor shards, is one reduce-scatter over data, one all-reduce over
    node of its half, one all-gather over data; the batch statistics' small all-reduces run
    over node x data; nothing is permuted."""
    node, strategy = collectives(("node", "data", "tensor"), (2, 2, 2))
    data, _ = collectives(("data", "tensor"), (4, 2))
    over = lambda rows, axes: {k: v for k, v in rows.items() if k[2] == axes}
    assert over(node, "tensor") == over(data, "tensor")
    assert over(node, "node+data+tensor") == renamed(over(data, "data+tensor"), "data", "node+data")
    state = strategy.state_shapes()
    mine = sum(
        math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
        for x in jax.tree.leaves(state.params)
    )
    buffer = -(-mine // 8) * 8  # float32, padded to a multiple of 2 (data) floats
    assert node[("step", "reduce-scatter", "data")] == (1, buffer // 2)
    assert node[("step", "all-reduce", "node")] == (1, buffer // 2)
    assert node[("step", "all-gather", "data")] == (1, buffer)
    count, stats = node[("step", "all-reduce", "node+data")]
    assert count == data[("step", "all-reduce", "data")][0] - 1 and stats < 0.02 * mine
    flat = {(kind, axes) for _, kind, axes in renamed(data, "data", "node+data")}
    two_level = {("reduce-scatter", "data"), ("all-reduce", "node"), ("all-gather", "data")}
    assert {(kind, axes) for _, kind, axes in node} == flat | two_level


@pytest.mark.parametrize("mode", ["allreduce", "sharded"])
def test_node_beside_data_and_tensor_equals_one_device(mode):
    """(node, data, tensor) = (2, 2, 2): 4 steps equal one device's, the hierarchical sum
    taken on each device's tensor shards (and, under `sharded`, on the leaves it cannot
    split). In float64 (tests/test_axes.py FLOAT64)."""
    config = mesh_config(
        ("node", "data", "tensor"), (2, 2, 2), **TENSOR, **FLOAT64, **{"sync.mode": mode}
    )
    with jax.enable_x64(True):
        reference = reference_run(mesh_config(("data",), (1,), **FLOAT64))
        assert_equal(run_steps(config, 8), reference, RTOL64)
