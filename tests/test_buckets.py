"""Gradient buckets (`sync.bucket_bytes`, jaxpar/parallel/buckets.py): leaves in the backward's
order, cut at the size; a bucketed step computes the single-device function under every rule
that combines gradients and on every kind of batch axis; on XLA:GPU's program a bucket
replaces the per-parameter kernels XLA's own combining leaves."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.tree_util import DictKey

from jaxpar import analysis, run_setup
from jaxpar.parallel import buckets
from jaxpar.parallel.buckets import Buckets
from jaxpar.predict.kernels import opclass
from jaxpar.predict.programs import gputarget
from jaxpar.predict.programs.workload import strategy_for
from tests.util import max_rel_error, reference_run, run_steps, tiny_config

RTOL = 1e-5
SMALL = 4096  # bytes: tiny_config's VGG11 gradient (about 40 KB) in about a dozen buckets


def test_buckets_follow_the_backward_and_stop_at_the_size():
    """The last layer's leaves first (each layer's in reverse tree order), a leaf under no
    layer before them; a bucket closes before it would pass the size, and a leaf larger
    than the size is a bucket of its own."""
    paths = [
        (DictKey("conv1"), DictKey("bias")),
        (DictKey("conv1"), DictKey("kernel")),
        (DictKey("dense"), DictKey("kernel")),
        (DictKey("stem"), DictKey("kernel")),
        (DictKey("unlisted"),),
    ]
    plan = Buckets(100, ("stem", "conv1", "dense"))
    order = plan.order(paths)
    assert order == [4, 2, 1, 0, 3]
    nbytes = [40, 50, 300, 60, 10]
    assert plan.split(order, nbytes) == [[4], [2], [1, 0], [3]]
    assert Buckets(0, plan.layers).split(order, nbytes) == [[4], [2], [1], [0], [3]]


def test_rows_hold_each_replicas_block_of_every_leaf():
    """`pack_rows` then row r back through `unpack_rows`: replica r's block of each leaf
    along its own dimension, as a tiled reduce-scatter of the rows leaves it; `pack` and
    `unpack` restore every leaf."""
    rng = np.random.default_rng(0)
    shapes = ((8, 3), (2, 4, 5), (12,), (3, 3, 2, 4))
    leaves = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in shapes]
    dims = [0, 1, 0, 3]
    rows = buckets.pack_rows(leaves, dims, 4)
    assert rows.shape == (4, sum(x.size for x in leaves) // 4)
    for r in range(4):
        got = buckets.unpack_rows(rows[r : r + 1], leaves, dims, 4)
        for x, d, block in zip(leaves, dims, got, strict=True):
            size = x.shape[d] // 4
            np.testing.assert_array_equal(
                block, jax.lax.slice_in_dim(x, r * size, (r + 1) * size, axis=d)
            )
    flat = buckets.pack(leaves)
    for x, y in zip(leaves, buckets.unpack(flat, leaves), strict=True):
        np.testing.assert_array_equal(x, y)
    # a convolution's kernel (H, W, I, O) goes in XLA:GPU's filter order (O, H, W, I)
    kernel = flat[-leaves[3].size :]
    np.testing.assert_array_equal(kernel, np.moveaxis(np.asarray(leaves[3]), -1, 0).reshape(-1))


# Each kind of collective a bucket goes through: an all-reduce (data x tensor: the buckets
# built inside a shard_map over the rules axes), node's two-level mean, sharded's
# reduce-scatter, the parameter server's collective-permutes beside stages and a tensor axis.
CASES = {
    "allreduce-data2xtensor4": ({"mesh_shape": (2, 1, 4)}, "all-reduce"),
    "allreduce-node2xdata4": (
        {"mesh_axes": ("node", "data"), "mesh_shape": (2, 4)},
        "reduce-scatter",
    ),
    "sharded-data8": ({"sync.mode": "sharded", "mesh_shape": (8, 1, 1)}, "reduce-scatter"),
    "parameter_server-2x2x2": (
        {
            "sync.mode": "parameter_server",
            "mesh_shape": (2, 2, 2),
            "pipeline.schedule": "1f1b",
            "pipeline.num_microbatches": 2,
        },
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bucketed_steps_are_the_single_device_step(case):
    overrides, _ = CASES[case]
    config = tiny_config(**overrides, **{"sync.bucket_bytes": SMALL})
    ref_losses, ref_state = reference_run(tiny_config(), steps=3)
    losses, state = run_steps(config, 8, steps=3)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert max_rel_error(state.opt_state, ref_state.opt_state) < RTOL


def _collective_calls(config, kind: str) -> int:
    setup = run_setup.setup(config, jax.devices())
    report = analysis.report(setup.strategy, config.global_batch_size, timing=False)
    return sum(row[3] for row in report["collectives"] if row[1] == kind)


def test_one_reduce_scatter_per_bucket():
    """node x data's gradient mean, a reduce-scatter over data, an all-reduce over node and
    an all-gather: one reduce-scatter per bucket in XLA:CPU's program (which does not join
    them again), one for the whole gradient without a size."""
    config = tiny_config(mesh_axes=("node", "data"), mesh_shape=(2, 4))
    setup = run_setup.setup(config, jax.devices())
    params = setup.strategy.canonical_shapes().params
    plan = Buckets(SMALL, tuple(layer.name for layer in setup.model.layers))
    count = len(plan.of_tree(params))
    assert count > 5
    bucketed = tiny_config(**{**CASES["allreduce-node2xdata4"][0], "sync.bucket_bytes": SMALL})
    assert _collective_calls(bucketed, "reduce-scatter") == count
    assert _collective_calls(config, "reduce-scatter") == 1


@pytest.mark.skipif(
    bool(gputarget.unavailable("h100_sxm")),
    reason=f"no compile-only XLA:GPU here: {gputarget.unavailable('h100_sxm')}",
)
def test_gpu_step_of_eight_launches_one_gpus_kernels_and_a_few_per_bucket():
    """XLA:GPU's data-8 step for eight H100s, tiny_config with BatchNorm over each GPU's
    batch (tf_cnn_benchmarks' setting, the DGX-1 predictions'): without buckets XLA
    joins the gradients' all-reduces after fusion and slices the result apart, a kernel per
    parameter; with one bucket (the default size holds this gradient) the step launches at
    most one GPU's kernels plus 3 (issue 68's target)."""
    settings = {"model.batch_norm": True, "sync.batch_norm": "local"}

    def kernels(devices: int, bucket_bytes: int) -> int:
        config = tiny_config(
            **settings, mesh_shape=(devices, 1, 1), **{"sync.bucket_bytes": bucket_bytes}
        )
        target = gputarget.Target("h100_sxm", 1, devices)
        with gputarget.uncached():
            strategy = strategy_for(config, devices, target.devices())
            programs = analysis.programs(strategy, config.global_batch_size)
        return sum(opclass.classify(p.compiled.as_text(), "gpu").kernels for p in programs)

    one = kernels(1, 0)
    assert kernels(8, 25_000_000) <= one + 3
    assert kernels(8, 0) > one + 3 + 20
