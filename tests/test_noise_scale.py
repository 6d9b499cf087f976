"""The gradient noise scale's two squared norms, as every strategy's train step reports them
(`grad_sq_small`, `grad_sq_big`; jaxpar/noise_scale.py), against plain jax.grad on one device.

Every strategy groups the global batch into equal runs of consecutive rows: data parallelism's
replica r, accumulation slice k is group r * slices + k; a pipeline's (micro-batch m, replica
r) is group r * M + m (put_batch: micro-batch m holds the m-th 1/M of every replica's share);
fsdp's replicas are data replicas. So the reference is the same on every mesh: each run's
gradient (its mean loss), and the whole batch's. BatchNorm is off (tiny_config), so the
groups' gradients are independent.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import SingleDeviceSharding

from jaxpar import hlo, run_setup
from jaxpar.parallel import norms
from jaxpar.parallel.state import forward_loss, host_init_state
from jaxpar.predict.programs import gputarget
from tests.util import tiny_config

RTOL = 1e-5


def first_step(config, num_devices: int) -> tuple[dict, object]:
    """The first train step's metrics (floats) and the strategy."""
    setup = run_setup.setup(config, jax.devices()[:num_devices])
    state = setup.strategy.init_state(jax.random.key(config.seed))
    batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, 0))
    _, metrics = setup.strategy.train_step(state, batch)
    return {k: float(v) for k, v in metrics.items()}, setup.strategy


@functools.cache
def reference(groups: int, **overrides) -> tuple[float, float]:
    """(mean over the `groups` consecutive runs of the batch of their gradients' squared
    norms, the whole batch's gradient's squared norm), from jax.grad on one device."""
    config = tiny_config(**overrides)
    setup = run_setup.setup(config, jax.devices()[:1])
    model = setup.model
    state = host_init_state(model, setup.strategy.tx, jax.random.key(config.seed))
    batch = run_setup.local_train_batch(setup, 0)

    @jax.jit
    def sq(batch):
        grads = jax.grad(lambda p: forward_loss(model, p, state.batch_stats, batch)[0])(
            state.params
        )
        return sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads))

    parts = [jax.tree.map(lambda v, i=i: np.split(v, groups)[i], batch) for i in range(groups)]
    small = np.mean([float(sq(part)) for part in parts])
    return small, float(sq(batch))


DATA_CASES = {
    "data8": (8, {"mesh_shape": (8, 1, 1)}, 8),
    "data2-tensor4-accum2": (8, {"mesh_shape": (2, 1, 4), "grad_accum_steps": 2}, 4),
    "one-device-accum4": (1, {"mesh_shape": (1, 1, 1), "grad_accum_steps": 4}, 4),
    "pipeline-data2-stage2-M2": (
        4,
        {"mesh_shape": (2, 2, 1), "pipeline.schedule": "1f1b", "pipeline.num_microbatches": 2},
        4,
    ),
    # zero-bubble V: two chunks a stage, residuals kept, the backward split in B and W
    "pipeline-zbv-stage2-tensor2-M2": (
        4,
        {
            "mesh_shape": (1, 2, 2),
            "pipeline.schedule": "zb-v",
            "pipeline.num_microbatches": 2,
            "pipeline.remat": False,
        },
        2,
    ),
    # fsdp: a replica's gradient of its sharded leaves is squared before the reduce-scatter
    "data2-fsdp4": (8, {"mesh_axes": ("data", "fsdp"), "mesh_shape": (2, 4)}, 8),
    "fsdp4-accum2": (
        4,
        {"mesh_axes": ("data", "fsdp"), "mesh_shape": (1, 4), "grad_accum_steps": 2},
        8,
    ),
    # and in a pipeline's stages, recomputing (1F1B) or from residuals split in B and W
    "pipeline-fsdp2-stage2-tensor2-M2": (
        8,
        {
            "mesh_axes": ("data", "fsdp", "stage", "tensor"),
            "mesh_shape": (1, 2, 2, 2),
            "pipeline.schedule": "1f1b",
            "pipeline.num_microbatches": 2,
        },
        4,
    ),
    "pipeline-zbh1-data2-fsdp2-stage2-M2": (
        8,
        {
            "mesh_axes": ("data", "fsdp", "stage"),
            "mesh_shape": (2, 2, 2),
            "pipeline.schedule": "zb-h1",
            "pipeline.remat": False,
            "pipeline.num_microbatches": 2,
        },
        8,
    ),
}


@functools.cache
def case_metrics(case: str) -> dict:
    """The first step's metrics of DATA_CASES[case] (each run once in a process)."""
    devices, overrides, groups = DATA_CASES[case]
    metrics, strategy = first_step(tiny_config(**overrides), devices)
    assert strategy.noise_groups() == groups
    return metrics


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_step_reports_the_groups_and_the_whole_gradient(case):
    metrics, groups = case_metrics(case), DATA_CASES[case][2]
    small, big = reference(groups)
    np.testing.assert_allclose(metrics["grad_sq_small"], small, rtol=RTOL)
    np.testing.assert_allclose(metrics["grad_sq_big"], big, rtol=RTOL)
    assert small > big  # a smaller batch's gradient is noisier


def test_one_gradient_size_reports_none():
    """One device without accumulation, or a pipeline of one replica and one micro-batch,
    have one batch size: no noise scale, and a reason."""
    for devices, overrides in [
        (1, {"mesh_shape": (1, 1, 1)}),
        (2, {"mesh_shape": (1, 2, 1), "pipeline.num_microbatches": 1}),
    ]:
        metrics, strategy = first_step(tiny_config(**overrides), devices)
        assert isinstance(strategy.noise_groups(), str)
        assert "grad_sq_small" not in metrics


def test_same_groups_same_figures_on_any_mesh():
    """Four groups of 4 rows of the same batch: as one device's 4 accumulation slices, as 2
    replicas x 2 slices beside a tensor axis, as a pipeline's 2 replicas x 2 micro-batches
    (with fsdp replicas, or data ones): the same two figures."""
    figures = [
        (metrics["grad_sq_small"], metrics["grad_sq_big"])
        for case, (_, _, groups) in DATA_CASES.items()
        if groups == 4
        for metrics in [case_metrics(case)]
    ]
    assert len(figures) == 4
    for other in figures[1:]:
        np.testing.assert_allclose(other, figures[0], rtol=RTOL)


def _mixed_tree():
    """More leaves than two GPU reductions read, of every rank to 4 (convolution kernels) and
    both dtypes, at scales 1e-3 to 10; and the float64 sum of their squares (of the values
    as float32 and bfloat16 hold them)."""
    rng = np.random.default_rng(0)
    shapes = [(3, 3, 8, 16), (16,), (64, 10), (), (7,), (1, 1, 1, 16), (3, 3, 3, 8), (300,)]
    leaves = [
        jnp.asarray(
            rng.normal(0, 10 ** rng.uniform(-3, 1), shapes[i % len(shapes)]),
            jnp.bfloat16 if i % 3 == 0 else jnp.float32,
        )
        for i in range(2 * norms.LEAVES_PER_REDUCTION + 11)
    ]
    exact = sum(np.sum(np.square(np.asarray(x, np.float64))) for x in leaves)
    return {f"leaf{i}": x for i, x in enumerate(leaves)}, exact


def test_squared_norm_is_the_sum_of_squares_either_way():
    """local_sq, and both of its forms (a reduction per leaf on a CPU; on a GPU the leaves
    concatenated, LEAVES_PER_REDUCTION a reduction), equal the float64 sum of squares to
    float32's rounding, over a tree of mixed shapes and dtypes; an empty tree is 0."""
    tree, exact = _mixed_tree()
    leaves = jax.tree.leaves(tree)
    assert len(leaves) > 2 * norms.LEAVES_PER_REDUCTION
    for fn in (norms.local_sq, lambda t: norms.sq_per_leaf(jax.tree.leaves(t))):
        np.testing.assert_allclose(float(jax.jit(fn)(tree)), exact, rtol=1e-6)
    np.testing.assert_allclose(float(jax.jit(norms.sq_concatenated)(leaves)), exact, rtol=1e-6)
    assert float(norms.local_sq({})) == 0.0


@pytest.mark.skipif(
    bool(gputarget.unavailable("h100_sxm")),
    reason=f"no compile-only XLA:GPU here: {gputarget.unavailable('h100_sxm')}",
)
def test_gpu_squared_norm_is_a_few_kernels():
    """Compiled for an H100 (gputarget), local_sq of more leaves than one reduction reads is
    two kernels per LEAVES_PER_REDUCTION leaves, where a reduction per leaf took one or two
    each, and copies nothing (the concatenations are read inside the reductions)."""
    tree, _ = _mixed_tree()
    leaves = [x for x in jax.tree.leaves(tree) if x.ndim < 4]  # given row-major: see _flat
    device = gputarget.Target("h100_sxm").devices()[0]
    shapes = [
        jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=SingleDeviceSharding(device))
        for x in leaves
    ]
    with gputarget.uncached():
        compiled = jax.jit(norms.local_sq).lower(shapes).compile()
    entry = hlo.parse(compiled.as_text()).entry
    kernels = sum(i.opcode in ("fusion", "custom-call") for i in entry)
    groups = -(-len(leaves) // norms.LEAVES_PER_REDUCTION)
    assert kernels <= 2 * groups + 1 < len(leaves) // 10, kernels
    assert compiled.memory_analysis().temp_size_in_bytes < 64 * 1024
