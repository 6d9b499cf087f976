"""Seed 002's convnet (Keras mnist_cnn) with its dropouts: the masks are drawn per example, so
every data and tensor partitioning trains exactly the single-device program, dropout on."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from configs import base
from jaxpar import models, parallel
from jaxpar.config import ConfigError
from jaxpar.parallel.state import init_state
from tests.util import max_rel_error, run_steps, tiny_config


def lenet_config(**overrides):
    return tiny_config(
        **{
            "model.name": "lenet",
            "model.width": 0.25,
            "model.dropout": True,
            "data.image_shape": (28, 28, 1),
            **overrides,
        }
    )


def test_keras_mnist_cnn_parameter_count():
    spec = base.get_config().model
    spec.name, spec.width, spec.dropout, spec.batch_norm = "lenet", 1.0, True, False
    model = models.build(spec, (28, 28, 1), 10)
    assert model.num_params == 1_199_882  # Keras' model.summary() of mnist_cnn
    assert model.stochastic


def test_dropout_is_off_in_evaluation_and_on_in_training():
    spec = base.get_config().model
    spec.name, spec.width, spec.batch_norm = "lenet", 0.25, False
    plain = models.build(spec, (28, 28, 1), 10)
    spec.dropout = True
    dropped = models.build(spec, (28, 28, 1), 10)
    variables = plain.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (8, 28, 28, 1))
    ids = np.arange(8, dtype=np.uint32)
    args = (variables["params"], {}, x)
    off = plain.apply(*args, train=False)[0]
    np.testing.assert_array_equal(dropped.apply(*args, train=False)[0], off)
    on = dropped.apply(*args, train=True, example=ids)[0]
    assert np.abs(np.asarray(on) - np.asarray(off)).max() > 1e-3
    # The same ids give the same masks; a row's mask does not depend on the others.
    again = dropped.apply(variables["params"], {}, x[4:], train=True, example=ids[4:])[0]
    np.testing.assert_allclose(again, on[4:], rtol=1e-6)


@pytest.mark.parametrize("mesh", [(4, 1, 1), (2, 1, 2)])
def test_partitionings_draw_the_single_device_masks(mesh):
    ref_losses, ref_state = run_steps(lenet_config(mesh_shape=(1, 1, 1)), 1)
    losses, state = run_steps(lenet_config(mesh_shape=mesh), 4)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert max_rel_error(state.params, ref_state.params) < 1e-5
    no_dropout, _ = run_steps(lenet_config(**{"mesh_shape": (1, 1, 1), "model.dropout": False}), 1)
    assert np.abs(no_dropout - ref_losses).max() > 1e-3  # dropout really ran


def test_pipeline_refuses_dropout_in_one_line():
    config = lenet_config(mesh_shape=(1, 2, 1))
    with pytest.raises(ConfigError, match="pipeline stages do not draw dropout masks") as info:
        parallel.validate(config, 2)
    assert "\n" not in str(info.value)


def test_init_state_has_plain_arrays():
    """Variables are created boxed with logical names (flax partitioning); the state is not."""
    model = models.build(lenet_config().model, (28, 28, 1), 10)
    state = init_state(model, optax.sgd(0.1), jax.random.key(0))
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state.params))


@pytest.mark.parametrize("mesh", [(4, 1, 1), (2, 1, 2)])
def test_gradient_accumulation_is_the_same_step(mesh):
    """grad_accum_steps runs each device's 4 rows as 2 or 4 slices: the same losses and
    parameters as one device in one piece, dropout on (masks follow the rows' ids)."""
    ref_losses, ref_state = run_steps(lenet_config(mesh_shape=(1, 1, 1)), 1)
    accum = 4 if mesh[0] == 4 else 2
    losses, state = run_steps(lenet_config(mesh_shape=mesh, grad_accum_steps=accum), 4)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert max_rel_error(state.params, ref_state.params) < 1e-5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"grad_accum_steps": 3}, "does not divide each device's batch of 4"),
        (
            {"grad_accum_steps": 2, "mesh_shape": (2, 2, 1), "model.dropout": False},
            "a pipeline splits its batch with pipeline.num_microbatches",
        ),
        ({"grad_accum_steps": 0}, "must be a positive integer"),
    ],
)
def test_gradient_accumulation_refuses_in_one_line(overrides, message):
    config = lenet_config(**{"mesh_shape": (4, 1, 1), **overrides})
    with pytest.raises(ConfigError, match=message) as info:
        parallel.validate(config, 4)
    assert "\n" not in str(info.value)


def test_gradient_accumulation_refuses_batch_norm():
    config = lenet_config(
        **{"mesh_shape": (4, 1, 1), "grad_accum_steps": 2, "model.batch_norm": True}
    )
    with pytest.raises(ConfigError, match="BatchNorm statistics per slice"):
        run_steps(config, 4)
