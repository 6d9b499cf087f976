"""Data parallelism computes the single-device function: same losses, same parameters."""

import jax
import numpy as np
import pytest

from jaxpar import analysis, hlo, run_setup
from jaxpar.parallel.state import forward_loss
from tests.util import max_rel_error, reference_run, run_steps, tiny_config

RTOL = 1e-5


@pytest.fixture(scope="module")
def reference():
    """The plain single-device program, with BatchNorm off and on, shared by the tests."""
    return {bn: reference_run(tiny_config(**{"model.batch_norm": bn})) for bn in (False, True)}


@pytest.mark.parametrize("batch_norm", [False, True], ids=["no_bn", "sync_bn"])
@pytest.mark.parametrize("num_devices", [1, 2, 4, 8])
def test_shard_map_matches_single_device(reference, num_devices, batch_norm):
    ref_losses, ref_state = reference[batch_norm]
    config = tiny_config(**{"model.batch_norm": batch_norm, "mesh_shape": (num_devices, 1, 1)})
    losses, state = run_steps(config, num_devices)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert max_rel_error(state.batch_stats, ref_state.batch_stats) < RTOL
    assert int(state.step) == 3
    assert np.ptp(ref_losses) > 1e-3  # the steps really change the model


@pytest.mark.parametrize("batch_norm", [False, True], ids=["no_bn", "sync_bn"])
def test_pmap_matches_single_device(reference, batch_norm):
    ref_losses, ref_state = reference[batch_norm]
    config = tiny_config(
        **{"model.batch_norm": batch_norm, "sync.impl": "pmap", "mesh_shape": (4, 1, 1)}
    )
    losses, state = run_steps(config, 4)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert max_rel_error(state.batch_stats, ref_state.batch_stats) < RTOL


@pytest.mark.parametrize("impl", ["shard_map", "pmap"])
def test_gradient_scale_is_one(impl):
    """One plain-SGD step with lr 1 moves the parameters by exactly minus the gradient."""
    overrides = {"optimizer.momentum": 0.0, "learning_rate": 1.0, "sync.impl": impl}
    _, start = reference_run(tiny_config(**overrides), steps=0)
    _, single = reference_run(tiny_config(**overrides), steps=1)
    _, multi = run_steps(tiny_config(**overrides, mesh_shape=(8, 1, 1)), 8, steps=1)
    g1 = jax.tree.map(lambda a, b: a - b, start.params, single.params)
    g8 = jax.tree.map(lambda a, b: a - b, start.params, multi.params)
    norm = lambda t: np.sqrt(sum(float(np.sum(np.square(x))) for x in jax.tree.leaves(t)))
    assert norm(g8) / norm(g1) == pytest.approx(1.0, abs=1e-5)
    assert max_rel_error(g8, g1) < 1e-4


def _compiled_collectives(config, num_devices):
    setup = run_setup.setup(config, jax.devices()[:num_devices])
    (step,) = analysis.programs(setup.strategy, config.global_batch_size)
    text = step.compiled.as_text()
    param_bytes = 4 * setup.model.num_params
    return hlo.collectives(text), param_bytes


@pytest.mark.parametrize("impl", ["shard_map", "pmap"])
def test_one_gradient_all_reduce_per_step(impl):
    found, param_bytes = _compiled_collectives(
        tiny_config(**{"mesh_shape": (8, 1, 1), "sync.impl": impl}), 8
    )
    reduces = [c for c in found if c.kind == "all-reduce"]
    big = [c for c in reduces if c.bytes >= param_bytes // 2]
    assert len(big) == 1, found  # the gradient is reduced once, not twice
    # Everything all-reduced is the gradient plus two scalar metrics: nothing is sent twice.
    assert param_bytes <= sum(c.bytes for c in reduces) <= param_bytes + 64
    assert not [c for c in found if c.kind != "all-reduce"]


def test_sync_batch_norm_adds_only_small_reductions():
    found, param_bytes = _compiled_collectives(
        tiny_config(**{"mesh_shape": (8, 1, 1), "model.batch_norm": True}), 8
    )
    reduces = [c for c in found if c.kind == "all-reduce"]
    assert len([c for c in reduces if c.bytes >= param_bytes // 2]) == 1
    # Statistics are per channel: far smaller than the parameters.
    assert sum(c.bytes for c in reduces if c.bytes < param_bytes // 2) < param_bytes // 10


def test_local_batch_norm_uses_per_replica_statistics():
    """With per-replica BatchNorm the loss is the mean of each replica's own-batch loss."""
    config = tiny_config(
        **{"model.batch_norm": True, "sync.batch_norm": "local", "mesh_shape": (2, 1, 1)}
    )
    setup = run_setup.setup(config, jax.devices()[:2])
    state = setup.strategy.init_state(jax.random.key(config.seed))
    host = run_setup.local_train_batch(setup, 0)
    halves = [{k: v[i * 8 : (i + 1) * 8] for k, v in host.items()} for i in range(2)]
    loss = jax.jit(
        lambda batch: forward_loss(setup.model, state.params, state.batch_stats, batch)[0]
    )
    expected = np.mean([float(loss(h)) for h in halves])
    whole = float(loss(host))
    _, metrics = setup.strategy.train_step(state, setup.strategy.put_batch(host))
    np.testing.assert_allclose(float(metrics["loss"]), expected, rtol=RTOL)
    assert abs(expected - whole) > 1e-4  # the two BatchNorm policies really differ here
