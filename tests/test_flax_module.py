"""A user's own flax.linen.Module (tests/example_flax.py) on every partitioning
(jaxpar/models/flax_module.py): it trains equal to one device on batch axes, on the tensor
axis by its annotations or by rules over parameter paths, in a pipeline cut between the
entries of an nn.Sequential; it computes what the same network in jaxpar's layers computes;
a checkpoint moves between meshes; and every bad input is one line before compiling."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpar import models, parallel, run_setup, trainer
from jaxpar.errors import ConfigError
from jaxpar.models import SequentialModel
from jaxpar.models.base import make_layer
from jaxpar.models.layers import ConvBlock, DenseBlock
from jaxpar.predict.programs import gputarget
from jaxpar.predict.programs.workload import workload
from tests import example_flax
from tests.util import max_rel_error, reference_run, run_steps, tiny_config, train_losses

RTOL = 1e-10  # float64: the partitionings differ only in summation order

# Conv kernels by output channels, the dense head by input features: what the annotations of
# tests/example_flax.py's `resnet` say, as rules over `resnet_plain`'s parameter paths.
PARAM_RULES = (
    (r"(conv\d|proj)/kernel", (None, None, "conv_in", "conv_out")),
    (r"bn\d/(scale|bias)|proj_bn/(scale|bias)", ("conv_out",)),
    (r"Dense_0/kernel", ("embed", "classes")),
)


def flax_config(builder: str, names, sizes, **extra):
    return tiny_config(
        **{
            "model.name": f"tests.example_flax:{builder}",
            "model.width": 0.25,
            "model.dtype": "float64",
            "model.layers": "layers" if builder == "sequential" else "",
            "mesh_axes": names,
            "mesh_shape": sizes,
            "num_train_steps": 2,
            **extra,
        }
    )


CASES = {
    "resnet data 8": ("resnet", ("data",), (8,), {}),
    "resnet_plain data x fsdp": ("resnet_plain", ("data", "fsdp"), (2, 4), {}),
    "resnet data x tensor by annotations": ("resnet", ("data", "tensor"), (2, 4), {}),
    "resnet data x spatial by its pinned activations": ("resnet", ("data", "spatial"), (4, 2), {}),
    "resnet_plain data x tensor by rules": (
        "resnet_plain",
        ("data", "tensor"),
        (2, 4),
        {"model.param_rules": PARAM_RULES},
    ),
    "sequential with dropout, data 8": ("sequential", ("data",), (8,), {"model.dropout": True}),
    "sequential pipeline (2,2,1)": (
        "sequential",
        ("data", "stage", "tensor"),
        (2, 2, 1),
        {
            "pipeline.schedule": "1f1b",
            "pipeline.num_microbatches": 2,
            "pipeline.split": ("layers_2",),
        },
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_flax_module_trains_equal_to_one_device(case):
    builder, names, sizes, extra = CASES[case]
    config = flax_config(builder, names, sizes, **extra)
    with jax.enable_x64(True):
        micro = config.pipeline.num_microbatches if "stage" in names else 1
        ref_losses, ref_state = reference_run(config, microbatches=micro)
        losses, state = run_steps(config, int(np.prod(sizes)))
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert max_rel_error(state.batch_stats, ref_state.batch_stats) < RTOL
    assert np.ptp(ref_losses) > 1e-4  # the steps change the model
    leaves = jax.tree.leaves(state.params)
    assert leaves and all(leaf.dtype == np.float64 for leaf in leaves)
    # the rules axes really split: halos between bands, channels' partial sums
    wanted = {"spatial": "collective-permute", "tensor": "all-reduce"}
    for axis, kind in wanted.items():
        if dict(zip(names, sizes, strict=True)).get(axis, 1) > 1:
            with jax.enable_x64(True):
                w = workload(config, int(np.prod(sizes)))
            calls = [c for ch in w.chunks for cols in ch.collectives.values() for c in cols]
            assert any(c.kind == kind and axis in c.axes for c in calls), (axis, calls)


def test_the_variables_are_the_modules_own():
    """The wrapped model's state is what the user's module initialises (same paths, shapes),
    an nn.Sequential's entries become its layers, and dropout is found where it is used."""
    config = flax_config(
        "sequential", ("data",), (8,), **{"model.dropout": True, "model.dtype": "float32"}
    )
    model = models.build(config.model, (32, 32, 3), 10)
    module = example_flax.sequential(config.model, (32, 32, 3), 10)
    own = jax.eval_shape(
        lambda x: module.init(jax.random.key(0), x, train=False),
        jax.ShapeDtypeStruct((1, 32, 32, 3), "f4"),
    )
    ours = model.variable_shapes()
    shapes = lambda t: jax.tree.map(lambda a: a.shape, t)
    own = nn.unbox(own)
    assert shapes(ours["params"]) == {
        **{f"layers_{i}": {} for i in range(4)},
        **shapes(own["params"]),
    }
    assert shapes(ours["batch_stats"]) == shapes(own["batch_stats"])
    assert [layer.name for layer in model.layers] == [f"layers_{i}" for i in range(4)]
    assert [layer.module.dropout for layer in model.layers] == [False, False, False, True]
    assert model.uncuttable is None
    config = flax_config("resnet", ("data",), (8,), **{"model.dtype": "float32"})
    whole = models.build(config.model, (32, 32, 3), 10)
    assert [layer.name for layer in whole.layers] == ["ResNet"] and whole.uncuttable
    plain = models.flax_module.from_module(
        nn.Sequential([nn.Conv(4, (3, 3)), nn.relu, _flatten, nn.Dense(10)]), "seq", (8, 8, 3), 10
    )
    assert [(layer.name, layer.params) for layer in plain.layers] == [
        ("layers_0", 3 * 3 * 3 * 4 + 4),
        ("layers_1", 0),
        ("layers_2", 0),
        ("layers_3", 8 * 8 * 4 * 10 + 10),
    ]


def _flatten(x):
    return x.reshape(x.shape[0], -1)


def test_a_flax_module_computes_what_jaxpars_layers_compute():
    """The same network as an nn.Sequential of flax's own layers and as jaxpar's layers, from
    one draw of parameters: the same logits, batch statistics and gradients over two SGD
    steps (float64)."""
    with jax.enable_x64(True):
        flax_model = models.flax_module.from_module(
            example_flax.Stack([_ConvBN(4), _ConvBN(8), _Logits(10)]),
            "flax",
            (16, 16, 3),
            10,
            layers_attr="layers",
            dtype=jnp.float64,
        )
        blocks = [
            ConvBlock(4, batch_norm=True, pool=True, in_axis="image", dtype=jnp.float64),
            ConvBlock(8, batch_norm=True, pool=True, dtype=jnp.float64),
            DenseBlock(10, relu=False, dtype=jnp.float64),
        ]
        layers, shape = [], (16, 16, 3)
        for i, block in enumerate(blocks):
            layers.append(make_layer(f"layers_{i}", block, shape))
            shape = layers[-1].out_shape
        ours = SequentialModel("ours", tuple(layers), (16, 16, 3), 10)
        variables = ours.init(jax.random.key(1))
        x = jax.random.normal(jax.random.key(2), (16, 16, 16, 3), jnp.float64)
        y = jnp.arange(16) % 10
        results = []
        for model in (ours, flax_model):
            params, stats = variables["params"], variables["batch_stats"]
            losses = []
            for _ in range(2):
                (loss, stats), grads = jax.value_and_grad(_loss, has_aux=True)(
                    params, stats, model, x, y
                )
                params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
                losses.append(float(loss))
            results.append((np.array(losses), params, stats))
    (ours_losses, ours_params, ours_stats), (flax_losses, flax_params, flax_stats) = results
    np.testing.assert_allclose(flax_losses, ours_losses, rtol=1e-10)
    assert max_rel_error(flax_params, ours_params) < 1e-10
    assert max_rel_error(flax_stats, ours_stats) < 1e-10
    assert abs(ours_losses[1] - ours_losses[0]) > 1e-4


def test_a_checkpoint_moves_from_tensor_to_data(tmp_path):
    """2 steps of `resnet` on (data, tensor) = (2, 4), saved; 2 more on data 8: the 4 steps of
    one device."""
    run = str(tmp_path / "run")
    extra = {"checkpoint_every_steps": 2, "num_train_steps": 2}
    with jax.enable_x64(True):
        ref_losses, ref_state = reference_run(flax_config("resnet", ("data",), (8,)), steps=4)
        trainer.train_and_evaluate(flax_config("resnet", ("data", "tensor"), (2, 4), **extra), run)
        result = trainer.train_and_evaluate(
            flax_config("resnet", ("data",), (8,), num_train_steps=4), run
        )
    np.testing.assert_allclose(train_losses(run), ref_losses, rtol=RTOL)
    assert max_rel_error(result.state.params, ref_state.params) < RTOL


@pytest.mark.skipif(
    bool(gputarget.unavailable("h100_sxm")),
    reason=f"no compile-only XLA:GPU here: {gputarget.unavailable('h100_sxm')}",
)
def test_the_predictor_compiles_a_flax_module_for_gpus():
    """The predictor's programs for 8 H100s, compiled here, of `resnet` on (data, tensor):
    XLA:GPU's, with their memory per GPU, matrix FLOPs and the tensor axis' all-reduces."""
    config = flax_config("resnet", ("data", "tensor"), (4, 2), **{"model.dtype": "float32"})
    w = workload(config, 8, gputarget.Target("h100_sxm", 1, 8))
    assert w.compiled_for.startswith("XLA:GPU") and w.memory_bytes_per_device > 0
    calls = [c for ch in w.chunks for cols in ch.collectives.values() for c in cols]
    assert any(c.kind == "all-reduce" and "tensor" in c.axes for c in calls)
    assert w.chunks[0].op_classes("step").flops > 0


BAD = {
    "no train": (
        "no_train",
        ("data",),
        (8,),
        {},
        r"NoTrain.__call__ takes no `train` argument",
    ),
    "wrong output": (
        "eleven",
        ("data",),
        (8,),
        {},
        r"logits of shape \(11,\) per example, not \(10,\)",
    ),
    "nothing for tensor": (
        "example_flax:resnet_plain",
        ("data", "tensor"),
        (2, 4),
        {},
        r"mesh axis 'tensor' \(4 devices\) would split nothing of model .*param_rules",
    ),
    "unmapped name": (
        "example_flax:resnet_plain",
        ("data", "tensor"),
        (2, 4),
        {"model.param_rules": ((r"Dense_0/kernel", ("embed", "heads")),)},
        r"ResNet/Dense_0/kernel is annotated 'heads', which no tensor.rules entry maps",
    ),
    "rule of the wrong rank": (
        "example_flax:resnet_plain",
        ("data",),
        (8,),
        {"model.param_rules": ((r"Dense_0/kernel", ("embed",)),)},
        r"names 1 dimensions of BasicBlock_0|names 1 dimensions of Dense_0/kernel",
    ),
    "pipeline of a whole module": (
        "example_flax:resnet",
        ("data", "stage", "tensor"),
        (2, 2, 1),
        {"pipeline.schedule": "gpipe", "pipeline.num_microbatches": 2},
        r"is one flax module \(ResNet\); a pipeline cuts between the entries of an nn.Sequential",
    ),
    "no such cut": (
        "example_flax:sequential",
        ("data", "stage", "tensor"),
        (2, 2, 1),
        {"pipeline.schedule": "gpipe", "pipeline.num_microbatches": 2, "pipeline.split": ("head",)},
        r"pipeline.split cuts at 'head', which is no layer of .*layers_0, layers_1",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_module_or_rule_is_one_line_before_compiling(case):
    builder, names, sizes, extra, said = BAD[case]
    path = f"tests.{builder}" if ":" in builder else f"tests.test_flax_module:{builder}"
    settings = {**extra, "model.name": path, "model.dtype": "float32"}
    if "sequential" in builder:
        settings["model.layers"] = "layers"
    config = flax_config("resnet", names, sizes, **settings)
    with pytest.raises(ConfigError) as info:
        setup = run_setup.setup(config, jax.devices()[: int(np.prod(sizes))])
        parallel.check_model(config, dict(zip(names, sizes, strict=True)), setup.model)
    message = str(info.value)
    assert re.search(said, message) and "\n" not in message, message


class NoTrain(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(x.reshape(x.shape[0], -1))


def no_train(model_config, input_shape, num_classes):
    return NoTrain()


class _Eleven(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        return nn.Dense(11)(x.reshape(x.shape[0], -1))


def eleven(model_config, input_shape, num_classes):
    return _Eleven()


class _ConvBN(nn.Module):
    """ConvBlock(batch_norm=True, pool=True) written with flax's layers."""

    features: int

    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Conv(self.features, (3, 3), dtype=jnp.float64, param_dtype=jnp.float64)(x)
        x = nn.BatchNorm(
            use_running_average=not train,
            momentum=0.9,
            epsilon=1e-5,
            dtype=jnp.float64,
            param_dtype=jnp.float64,
        )(x)
        return nn.max_pool(nn.relu(x), (2, 2), (2, 2))


class _Logits(nn.Module):
    """DenseBlock(relu=False) written with flax's layers."""

    features: int

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(self.features, dtype=jnp.float64, param_dtype=jnp.float64)(x)


def _loss(params, stats, model, x, y):
    logits, stats = model.apply(params, stats, x, train=True)
    loss = -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])
    return loss, stats
