"""The source documents' other models: ResNets (CIFAR and ImageNet), DenseNet, AlexNet and
Inception-v3, with their published parameter counts and work; and every model family (these,
VGG and LeNet) under a data x tensor mesh and a hybrid (data x stage x tensor) pipeline cut
next to each kind of block, equal to one device."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from jaxpar import models
from jaxpar.errors import ConfigError
from jaxpar.models.blocks import count_flops
from jaxpar.parallel import stages
from tests.util import max_rel_error, reference_run, run_steps, tiny_config

# name, input, classes, parameters, forward GMACs (None: not pinned). References: torchvision
# (resnet50/152, alexnet at 224, inception_v3 without its auxiliary head), He et al. with
# shortcut A (CIFAR ResNets, 0.27M for resnet20), Huang et al. (DenseNet-40/100 k=12: 1.0M,
# 7.0M), tf_cnn_benchmarks' CIFAR AlexNet.
PUBLISHED = [
    ("resnet20", (32, 32, 3), 10, 269_722, None),
    ("resnet32", (32, 32, 3), 10, 464_154, None),
    ("resnet44", (32, 32, 3), 10, 658_586, None),
    ("resnet56", (32, 32, 3), 10, 853_018, None),
    ("resnet110", (32, 32, 3), 10, 1_727_962, None),
    ("resnet50", (224, 224, 3), 1000, 25_557_032, 4.09),
    ("resnet152", (224, 224, 3), 1000, 60_192_808, 11.51),
    ("densenet40", (32, 32, 3), 10, 1_019_738, None),
    ("densenet100", (32, 32, 3), 10, 6_979_658, None),
    ("alexnet", (224, 224, 3), 1000, 61_100_840, 0.71),
    ("alexnet", (32, 32, 3), 10, 1_756_426, None),
    ("inception_v3", (299, 299, 3), 1000, 23_834_568, 5.71),
]


def build(name, shape, classes, width=1.0):
    spec = base.get_config().model
    spec.name, spec.width = name, width
    return models.build(spec, shape, classes)


@pytest.mark.parametrize(
    "name,shape,classes,params,gmacs", PUBLISHED, ids=[f"{p[0]}-{p[1][0]}" for p in PUBLISHED]
)
def test_published_parameter_counts_and_work(name, shape, classes, params, gmacs):
    model = build(name, shape, classes)
    assert model.num_params == params
    if gmacs is not None:
        assert model.flops_per_example / 2e9 == pytest.approx(gmacs, abs=0.005)
    assert model.layers[-1].out_shape == (classes,)


def test_depths_are_the_names():
    """6n+2 weighted layers for CIFAR ResNets, (depth-4)/3 dense layers per DenseNet block."""
    for depth in (20, 32, 44, 56, 110):
        blocks = len(build(f"resnet{depth}", (32, 32, 3), 10).layers) - 2  # stem, head
        assert 2 * blocks + 2 == depth
    dense = [l for l in build("densenet100", (32, 32, 3), 10).layers if l.name.startswith("dense")]
    assert len(dense) == 96 and dense[-1].out_shape == (8, 8, 16 + 96 * 12)
    assert [l.out_shape for l in build("resnet50", (224, 224, 3), 1000).layers][-2] == (7, 7, 2048)


def test_traced_flops_equal_the_hand_formulas():
    """count_flops (the blocks' FLOPs, read from the traced program) agrees with the hand
    formulas of the VGG and LeNet layers, so both are checked against each other."""
    for model in (build("vgg11", (32, 32, 3), 10, 0.25), build("lenet", (28, 28, 1), 10, 0.5)):
        for layer in model.layers:
            assert count_flops(layer.module, layer.in_shape) == layer.flops, layer.name


def test_every_split_policy_cuts_between_blocks():
    for name, shape in (("resnet110", (32, 32, 3)), ("inception_v3", (299, 299, 3))):
        model = build(name, shape, 10, 0.125)
        n = len(model.layers)
        for policy in ("flops", "params", "uniform", (2, n // 2, n - 2)):
            bounds = stages.split(model, 4, policy)
            covered = [i for a, b in itertools.pairwise(bounds) for i in range(a, b)]
            assert covered == list(range(n)), policy


@pytest.mark.parametrize(
    ("name", "shape", "message"),
    [
        ("inception_v3", (32, 32, 3), "at least 75x75"),
        ("alexnet", (256, 256, 3), "7x7 feature maps, which do not pool evenly to 6x6"),
    ],
)
def test_inputs_a_model_cannot_take_are_refused_in_one_line(name, shape, message):
    with pytest.raises(ConfigError, match=message) as info:
        build(name, shape, 10)
    assert "\n" not in str(info.value)


# Per family: the model, its width (every channel count even, so a tensor axis of 2 divides
# it), input, compute dtype, learning rate, and the hybrid pipeline's cut points (the indices
# of the layers where chunks 1.. begin, in the model every_block_kind_once builds): 2v - 1 of
# them for v chunks on each of 2 stages, placed so that every kind of block, parameter-free
# ones included, has a cut before or after it (test_every_family_partitioned_equals_one_device
# checks that). resnet50 and inception_v3 at these tiny widths are chaotic: a 1-ulp difference
# of summation order grows to 1e-2 in 3 steps, even between two single-device programs, so
# they are compared in float64 (parameters, gradients, updates and logits too: models/layers.py
# `wide`), where every partitioning agrees to about 1e-13, at lr 0.001. So is the tiny VGG11
# with BatchNorm: its BatchNorm biases (about 4e-4, gradients that nearly cancel) come out 6%
# apart in float32 under any pipeline schedule, 1F1B included, and 4e-15 apart in float64.
# The others hold to 1e-5 in float32.
class Family(NamedTuple):
    model: str
    width: float
    shape: tuple[int, int, int]
    dtype: str
    lr: float
    cuts: tuple[int, ...]


FAMILIES = {
    # ConvBlocks with and without a max-pool, BatchNorm, the dense head: conv1-3|conv4-6|conv7-8|fc1
    "vgg": Family("vgg11", 1 / 16, (32, 32, 3), "float64", 0.02, (3, 6, 8)),
    # VALID convs, a pool, two dense layers, each its own chunk
    "lenet": Family("lenet", 1 / 4, (28, 28, 1), "float32", 0.05, (1, 2, 3)),
    # stem|identity block|two stride-2 blocks with shortcut A|head
    "resnet20": Family("resnet20", 0.25, (16, 16, 3), "float32", 0.05, (1, 2, 4)),
    # stem|projection (stride 1), identity|projections (stride 2)|head
    "resnet50": Family("resnet50", 1 / 16, (64, 64, 3), "float64", 0.001, (1, 3, 6)),
    # stem without BatchNorm|dense layers|transition, ...|BatchNorm head
    "densenet": Family("densenet10", 0.5, (16, 16, 3), "float32", 0.05, (1, 3, 9)),
    # the CIFAR AlexNet: LRN after the pool|LRN before it|hidden dense layers|logits
    "alexnet": Family("alexnet", 1 / 8, (32, 32, 3), "float32", 0.05, (1, 2, 4)),
    # torchvision's: conv1|conv2-3|conv4-5|the parameter-free adaptive pool|fc1-2|fc3
    "alexnet224": Family("alexnet", 1 / 16, (224, 224, 3), "float32", 0.05, (1, 3, 5, 6, 8)),
    # stem|A|B|C|D, E|head: one module of each kind
    "inception_v3": Family("inception_v3", 1 / 8, (75, 75, 3), "float64", 0.001, (1, 2, 3, 4, 6)),
}
RTOL = {"float32": 1e-5, "float64": 1e-10}
STEPS = 3


def family_config(family, batch_norm=True, **overrides):
    f = FAMILIES[family]
    return tiny_config(
        **{
            "model.name": f.model,
            "model.width": f.width,
            "data.image_shape": f.shape,
            "model.batch_norm": batch_norm,
            "model.dtype": f.dtype,
            "learning_rate": f.lr,
            "global_batch_size": 8,
            **overrides,
        }
    )


# Every family with BatchNorm where it has one (LeNet and AlexNet have none), and ResNet-20
# without it too (residual blocks whose convolutions take biases and keep no statistics).
# Inception's branches without BatchNorm add nothing those two do not cover, and take long.
CASES = [(name, name not in ("lenet", "alexnet", "alexnet224")) for name in FAMILIES]
CASES += [("resnet20", False)]


@pytest.fixture
def every_block_kind_once(monkeypatch, request):
    """Each family with every kind of block it has, each as often as needed to meet all of its
    shapes, and no more (compiling the pipeline's chunk programs and the reference dominates
    these tests, and grows with depth): a CIFAR ResNet of one basic block per stage (an
    identity block, and two with stride-2 shortcut A), a ResNet-50 of stages (2, 1, 1, 1)
    (projections with stride 1 and 2, and an identity bottleneck), a DenseNet of 10 layers (3
    dense blocks of 2 layers, densenet40's 40 units compile for minutes), an Inception-v3 of
    one module of each kind A-E. tests/test_model_zoo.py::test_published_parameter_counts_and_work
    builds the full depths."""
    from jaxpar.models import densenet, inception, resnet

    monkeypatch.setitem(resnet.CIFAR, "resnet20", 1)
    monkeypatch.setitem(resnet.IMAGENET, "resnet50", (2, 1, 1, 1))
    monkeypatch.setitem(densenet.DEPTHS, "densenet10", 10)
    monkeypatch.setattr(densenet, "NAMES", (*densenet.NAMES, "densenet10"))
    monkeypatch.setattr(models, "NAMES", (*models.NAMES, "densenet10"))
    keep = {"stem", "mixed5b", "mixed6a", "mixed6b", "mixed7a", "mixed7b", "head"}
    full = inception.sequential
    monkeypatch.setattr(
        inception,
        "sequential",
        lambda name, modules, *a: full(name, [m for m in modules if m[0] in keep], *a),
    )
    models.forget_built()  # builds of the full depths, or of these, stay in their tests
    request.addfinalizer(models.forget_built)
    f = FAMILIES[request.node.callspec.params["family"]]
    units = {"resnet20": 5, "resnet50": 7, "densenet10": 10, "inception_v3": 7}
    model = build(f.model, f.shape, 10, f.width)
    assert len(model.layers) == units.get(f.model, len(model.layers))
    return model


def block_kind(layer) -> tuple:
    """What makes two layers different kinds of block: the class, Inception's module kind,
    pools and LRN, the stride, and whether the block keeps its input's shape (an identity
    residual block against a projection)."""
    module = layer.module
    fields = ("kind", "pool", "lrn", "stride", "bn_relu", "pre_bn", "relu")
    return (
        type(module).__name__,
        *(getattr(module, f, None) for f in fields),
        layer.in_shape == layer.out_shape,
    )


@pytest.mark.parametrize(
    ("family", "batch_norm"), CASES, ids=[f"{n}-{'bn' if bn else 'nobn'}" for n, bn in CASES]
)
def test_every_family_partitioned_equals_one_device(family, batch_norm, every_block_kind_once):
    """Each family, with every kind of block it has (fixture every_block_kind_once), trains
    the one-device program for 3 steps on the hybrid (2,2,2): losses, parameters and
    BatchNorm statistics to 1e-5 in float32, 1e-10 in float64.

    The hybrid is an interleaved pipeline of 2v chunks on 2 stages, cut next to every kind of
    block, with data and tensor inside each stage (every block's channels split over `tensor`,
    BatchNorm synchronised over `data`) and 2 micro-batches, each normalised with its own
    BatchNorm statistics (the documented policy). Without a pipeline the data x tensor step
    runs the same tensor rules over the whole model in one program: tests/test_tensor.py holds
    it on every factorisation of 8, with synchronised BatchNorm."""
    f, model = FAMILIES[family], every_block_kind_once
    kinds = {block_kind(layer) for layer in model.layers}
    beside_a_cut = {
        block_kind(layer) for i, layer in enumerate(model.layers) if i in f.cuts or i + 1 in f.cuts
    }
    assert beside_a_cut == kinds and len(f.cuts) % 2 == 1
    hybrid = {
        "mesh_shape": (2, 2, 2),
        "pipeline.schedule": "interleaved",
        "pipeline.virtual_stages": (len(f.cuts) + 1) // 2,
        "pipeline.split": f.cuts,
        "pipeline.num_microbatches": 2,
    }
    rtol = RTOL[f.dtype]
    with jax.enable_x64(f.dtype == "float64"):
        ref_losses, ref_state = reference_run(
            family_config(family, batch_norm, **hybrid), STEPS, microbatches=2
        )
        losses, state = run_steps(family_config(family, batch_norm, **hybrid), 8, STEPS)
    np.testing.assert_allclose(losses, ref_losses, rtol=rtol)
    assert max_rel_error(state.params, ref_state.params) < rtol
    assert bool(jax.tree.leaves(state.batch_stats)) == batch_norm
    assert max_rel_error(state.batch_stats, ref_state.batch_stats) < rtol


def test_float64_runs_are_float64_throughout():
    """model.dtype=float64 (numerical checks) makes parameters, and so gradients, updates and
    their all-reduce, float64, and the logits too; float32 and bfloat16 compute keep float32
    parameters and logits. In both kinds of block: ConvBlock/DenseBlock (LeNet with
    BatchNorm) and Block's convolutions, BatchNorm and pooled head (ResNet-20)."""
    with jax.enable_x64(True):
        for name, shape in (("lenet", (28, 28, 1)), ("resnet20", (16, 16, 3))):
            for dtype, wide in (
                ("float64", jnp.dtype("float64")),
                ("float32", jnp.dtype("float32")),
                ("bfloat16", jnp.dtype("float32")),
            ):
                spec = base.get_config().model
                spec.name, spec.width, spec.batch_norm, spec.dtype = name, 0.25, True, dtype
                model = models.build(spec, shape, 10)
                variables = jax.eval_shape(model.init, jax.random.key(0))
                assert {x.dtype for x in jax.tree.leaves(variables["params"])} == {wide}
                # running averages stay float32 whatever the compute dtype (flax's)
                assert {x.dtype for x in jax.tree.leaves(variables["batch_stats"])} == {
                    jnp.dtype(jnp.float32)
                }
                x = jax.ShapeDtypeStruct((2, *shape), jnp.float32)
                logits, _ = jax.eval_shape(
                    lambda v, x, model=model: model.apply(
                        v["params"], v["batch_stats"], x, train=True
                    ),
                    variables,
                    x,
                )
                assert logits.dtype == wide, (name, dtype)


def test_batch_norm_off_gives_each_conv_a_bias():
    """resnet20 without BatchNorm: each of its 19 BatchNorms (688 channels, a scale and an
    offset each) becomes one bias on the conv before it: 269,722 - 688 parameters."""
    spec = base.get_config().model
    spec.name, spec.width, spec.batch_norm = "resnet20", 1.0, False
    model = models.build(spec, (32, 32, 3), 10)
    assert model.num_params == 269_722 - 688
    variables = jax.eval_shape(model.init, jax.random.key(0))
    assert variables["batch_stats"] == {}


def test_float64_needs_jax_64_bit_mode_in_one_line():
    from jaxpar import parallel

    config = family_config("resnet20", **{"model.dtype": "float64", "mesh_shape": (1, 1, 1)})
    with pytest.raises(ConfigError, match="JAX_ENABLE_X64=1") as info:
        parallel.validate(config, 1)
    assert "\n" not in str(info.value)
    with jax.enable_x64(True):
        assert tuple(parallel.validate(config, 1).values()) == (1, 1, 1)


def test_resnet20_learns_digits():
    """Learning, not just running: ResNet-20 at quarter width on the embedded digits (28x28
    grey, 10 classes, chance 0.1) reaches four times chance on held-out images after one
    pass over 5,120 images in 80 steps of batch 64 (the full runs' figures on shapes10:
    docs/config.md, "Each model's config, run")."""
    from jaxpar import run_setup

    config = tiny_config(
        **{
            "model.name": "resnet20",
            "model.width": 0.25,
            "model.batch_norm": True,
            "data.name": "digits",
            "data.image_shape": (28, 28, 1),
            "data.num_train": 5120,  # one pass in 80 steps
            "data.num_eval": 256,
            "global_batch_size": 64,
            "num_train_steps": 80,
            "learning_rate": 0.1,
            "lr_schedule": "cosine",
            "warmup_steps": 10,
            "weight_decay": 5e-4,
            "mesh_shape": (1, 1, 1),
        }
    )
    setup = run_setup.setup(config, jax.devices()[:1])
    state = setup.strategy.init_state(jax.random.key(config.seed))
    for i in range(config.num_train_steps):
        batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, i))
        state, _ = setup.strategy.train_step(state, batch)
    result = run_setup.evaluate(setup, state)
    assert result["count"] == 256
    assert result["accuracy"] > 0.4, result
