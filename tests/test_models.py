import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpar import config as config_lib
from jaxpar import run_setup
from jaxpar.models.lenet import lenet
from jaxpar.models.vgg import vgg
from tests.util import max_rel_error, reference_run, run_steps, tiny_config


@pytest.mark.parametrize(
    "input_shape,classes,bn,expected",
    [
        ((32, 32, 3), 10, True, 20_040_522),
        ((32, 32, 3), 10, False, 20_029_514),
        ((224, 224, 3), 1000, False, 143_667_240),
    ],
)
def test_vgg19_parameter_counts(input_shape, classes, bn, expected):
    model = vgg("vgg19", input_shape, classes, batch_norm=bn)
    assert model.num_params == expected
    # The per-layer costs add up to what init actually creates.
    variables = jax.eval_shape(model.init, jax.random.key(0))
    assert sum(x.size for x in jax.tree.leaves(variables["params"])) == expected


def test_vgg_layer_sequence_is_cuttable():
    cifar = vgg("vgg19", (32, 32, 3), 10)
    imagenet = vgg("vgg19", (224, 224, 3), 1000)
    assert [layer.name for layer in cifar.layers][-2:] == ["conv16", "fc1"]
    assert len(cifar.layers) == 17 and len(imagenet.layers) == 19
    for prev, nxt in zip(imagenet.layers, imagenet.layers[1:]):
        assert prev.out_shape == nxt.in_shape
    assert imagenet.layers[-1].out_shape == (1000,)
    # VGG's FLOPs sit early and its parameters late: what a pipeline split has to balance.
    first, last = cifar.layers[:8], cifar.layers[8:]
    assert sum(x.flops for x in first) > sum(x.flops for x in last)
    assert sum(x.params for x in first) < sum(x.params for x in last)
    # conv1 of VGG at 32x32: 2 * 32*32 * 3*3*3 * 64 FLOPs.
    assert cifar.layers[0].flops == 2 * 32 * 32 * 27 * 64


@pytest.mark.parametrize("name,convs", [("vgg11", 8), ("vgg13", 10), ("vgg16", 13)])
def test_vgg_family_depths(name, convs):
    model = vgg(name, (32, 32, 3), 10, width=0.125)
    assert sum(layer.name.startswith("conv") for layer in model.layers) == convs


def test_width_multiplier_and_apply_shapes():
    model = vgg("vgg11", (32, 32, 3), 7, width=0.25, batch_norm=True)
    assert model.layers[0].out_shape == (16, 16, 16)  # vgg11 pools after conv1
    variables = model.init(jax.random.key(0))
    x = jnp.ones((2, 32, 32, 3))
    logits, stats = model.apply(variables["params"], variables["batch_stats"], x, train=True)
    assert logits.shape == (2, 7) and logits.dtype == jnp.float32
    assert set(stats) == {layer.name for layer in model.layers if layer.name.startswith("conv")}
    # Running a cut model in two halves computes the same function.
    h, _ = model.apply(
        variables["params"], variables["batch_stats"], x, train=False, layers=slice(0, 4)
    )
    out, _ = model.apply(
        variables["params"], variables["batch_stats"], h, train=False, layers=slice(4, None)
    )
    full, _ = model.apply(variables["params"], variables["batch_stats"], x, train=False)
    assert jnp.allclose(out, full, rtol=1e-6, atol=1e-6)


def test_lenet_matches_keras_mnist_cnn():
    model = lenet((28, 28, 1), 10)
    assert model.num_params == 1_199_882
    assert model.layers[1].out_shape == (12, 12, 64)


def test_vgg_rejects_too_small_input():
    with pytest.raises(ValueError, match="at least 32x32"):
        vgg("vgg19", (28, 28, 1), 10)


def test_bfloat16_compute_keeps_float32_params():
    model = vgg("vgg11", (32, 32, 3), 10, width=0.125, dtype=jnp.bfloat16)
    variables = model.init(jax.random.key(0))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(variables["params"]))
    logits, _ = model.apply(variables["params"], {}, jnp.ones((2, 32, 32, 3)), train=True)
    assert logits.dtype == jnp.float32


def test_a_model_from_outside_the_package_is_partitioned_like_the_built_ins():
    """`model.name` as an import path (tests/example_model.py:build): the user's network
    trains equal to one device on a (data, stage, tensor) hybrid, and a path that does not
    import is one line."""
    config = tiny_config(
        **{
            "model.name": "tests.example_model:build",
            "model.width": 0.25,
            "mesh_shape": (2, 2, 2),
            "pipeline.schedule": "1f1b",
            "pipeline.num_microbatches": 2,
        }
    )
    ref_losses, ref_state = reference_run(config, 3, microbatches=2)
    losses, state = run_steps(config, 8, 3)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert max_rel_error(state.params, ref_state.params) < 1e-5
    assert set(state.params) == {"wide", "mid", "narrow", "fc1", "fc2"}
    for bad, said in (
        ("tests.no_such_module:build", "ModuleNotFoundError"),
        ("tests.example_model:nope", "AttributeError"),
        ("vgg99", "or give the import path"),
    ):
        with pytest.raises(config_lib.ConfigError) as info:
            run_setup.setup(tiny_config(**{"model.name": bad}), None)
        assert re.search(said, str(info.value)) and "\n" not in str(info.value)
