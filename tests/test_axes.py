"""The open mesh: axes as a registry (jaxpar/axes/). fsdp, node x data and a user's own axis
(tests/example_axis.py) each compute the single-device function with BatchNorm on, alone and
beside a pipeline and a tensor axis; what each moves and stores is read from the compiled
programs and checked against what the docs say; checkpoints move between them; the predictor
and the planner take them like any other mesh."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from jaxpar import analysis, axes, explain, parallel, plan, run_setup, trainer
from jaxpar.errors import ConfigError
from jaxpar.predict.programs.workload import describe, workload
from tests import example_axis
from tests.util import max_rel_error, reference_run, run_steps, tiny_config, train_losses

STEPS = 4
RTOL = 1e-5


def mesh_config(names, sizes, **extra):
    """tiny_config (VGG11 at width 1/16) with BatchNorm on, on the mesh `names` = `sizes`."""
    settings = {"model.batch_norm": True, "num_train_steps": STEPS, **extra}
    return tiny_config(mesh_axes=tuple(names), mesh_shape=tuple(sizes), **settings)


@pytest.fixture(scope="module")
def one_device():
    """The single-device program (no micro-batches: every data-parallel mesh's reference)."""
    return reference_run(mesh_config(("data",), (1,)))


def assert_equal(got, ref, rtol=RTOL):
    (losses, state), (ref_losses, ref_state) = got, ref
    np.testing.assert_allclose(losses, ref_losses, rtol=rtol)
    assert max_rel_error(state.params, ref_state.params) < rtol
    assert max_rel_error(state.batch_stats, ref_state.batch_stats) < rtol


# In float64, as the zoo's VGG with BatchNorm (tests/test_model_zoo.py FAMILIES): where a
# mesh reduces a step's sums in more orders than data alone, float32's rounding of BatchNorm's
# nearly cancelling bias gradients reaches 1e-5 within 3 steps; float64 holds such meshes to
# the single-device function by the same check at 1e-10.
FLOAT64 = {"model.dtype": "float64"}
RTOL64 = 1e-10


@pytest.mark.parametrize("names,sizes", [(("data", "fsdp"), (2, 4)), (("node", "data"), (2, 4))])
def test_batch_axes_equal_one_device(one_device, names, sizes):
    """FSDP beside data (HSDP) and two-level data parallelism: one device's 4 steps."""
    assert_equal(run_steps(mesh_config(names, sizes), 8), one_device)


def test_fsdp_beside_a_pipeline_and_a_tensor_axis_equals_one_device():
    """(data, fsdp, stage, tensor) = (1, 2, 2, 2), 1F1B over 2 micro-batches: each stage's
    parameters sharded over its own fsdp devices, channels over tensor. In float64 (FLOAT64)."""
    config = mesh_config(
        ("data", "fsdp", "stage", "tensor"),
        (1, 2, 2, 2),
        **{"pipeline.schedule": "1f1b", "pipeline.num_microbatches": 2, **FLOAT64},
    )
    with jax.enable_x64(True):
        assert_equal(run_steps(config, 8), reference_run(config, microbatches=2), RTOL64)


def _leaves(strategy):
    """(global bytes, PartitionSpec) of every parameter leaf as placed."""
    state = strategy.state_shapes()
    return [
        (math.prod(x.shape) * x.dtype.itemsize, x.sharding.spec)
        for x in jax.tree.leaves(state.params)
    ]


def _bytes(report, kind, axis) -> float:
    return sum(r[4] for r in report["collectives"] if r[1] == kind and r[2] == axis)


def test_fsdp_stores_a_quarter_and_moves_what_the_docs_say():
    """Under (data, fsdp) = (2, 4), from the placed state and the compiled step: parameters
    and optimizer state per device are the leaves split over fsdp at 1/4 plus the few that
    divide nowhere; per step the gradients' reduce-scatter on fsdp receives one shard of every
    split leaf; the all-gathers on fsdp bring every split leaf whole for the forward, and
    again those the backward needs (at most twice in all); the data axis all-reduces only
    shards."""
    setup = run_setup.setup(mesh_config(("data", "fsdp"), (2, 4)), jax.devices())
    leaves = _leaves(setup.strategy)
    split = [b for b, spec in leaves if "fsdp" in tuple(spec)]
    whole = [b for b, spec in leaves if "fsdp" not in tuple(spec)]
    assert sum(whole) < 0.01 * sum(split)  # only a 10-class bias or so stays whole
    report = analysis.report(setup.strategy, 16, timing=False)
    per_device = sum(split) / 4 + sum(whole)
    assert report["param_bytes_per_device"] == per_device
    opt = jax.tree.leaves(setup.strategy.canonical_shapes().opt_state)
    total_opt = sum(math.prod(x.shape) * x.dtype.itemsize for x in opt)
    counters = total_opt - sum(b for b, _ in leaves)  # momentum: one trace per parameter
    assert report["opt_state_bytes_per_device"] == per_device + counters
    assert _bytes(report, "reduce-scatter", "fsdp") == sum(split) / 4
    gathered = _bytes(report, "all-gather", "fsdp")
    assert sum(split) < gathered < 2 * sum(split)
    assert _bytes(report, "all-reduce", "data") == sum(split) / 4
    text = explain.explain(mesh_config(("data", "fsdp"), (2, 4)))
    assert "fsdp       4  batch" in text and "all-gather" in text and "reduce-scatter" in text


def test_node_carries_a_quarter_of_the_gradient():
    """(node, data) = (2, 4): the gradient mean is a reduce-scatter over data, an all-reduce
    over node of each device's quarter, an all-gather over data, each once a step on every
    gradient leaf as one buffer (padded to a multiple of 4 floats); what crosses node per
    device is 1/4 of the gradient bytes."""
    setup = run_setup.setup(mesh_config(("node", "data"), (2, 4)), jax.devices())
    report = analysis.report(setup.strategy, 16, timing=False)
    grads = sum(b for b, _ in _leaves(setup.strategy))
    quarter = -(-grads // 4 // 4) * 4  # the float32 buffer padded to 4 floats, over 4
    assert _bytes(report, "all-reduce", "node") == quarter
    assert _bytes(report, "reduce-scatter", "data") == quarter
    assert _bytes(report, "all-gather", "data") == 4 * quarter
    calls = {(r[1], r[2]): r[3] for r in report["collectives"]}
    assert calls[("reduce-scatter", "data")] == calls[("all-gather", "data")] == 1
    assert calls[("all-reduce", "node")] == 1
    assert setup.strategy.partitioning() == "hybrid node 2 x data 4"


def test_other_sync_modes_treat_node_x_data_as_one_flat_group():
    """Every mode but allreduce combines node x data = (2, 4) as one group of 8 replicas, as
    data = 8 does: the parameter server (replica 0 of the flattened group) receives and sends
    with collective-permutes over both axes at once. (The two meshes compile to two programs,
    whose float rounding XLA:CPU may fuse differently: equal to RTOL, not bit for bit.)"""
    settings = {"sync.mode": "parameter_server", "num_train_steps": 3}
    flat = run_steps(mesh_config(("data",), (8,), **settings), 8)
    got = run_steps(mesh_config(("node", "data"), (2, 4), **settings), 8)
    np.testing.assert_allclose(got[0], flat[0], rtol=RTOL)
    assert max_rel_error(got[1].params, flat[1].params) < RTOL


def test_checkpoint_of_fsdp_and_tensor_continues_on_data(tmp_path, one_device, capsys):
    """2 steps on (data, fsdp, tensor) = (2, 2, 2), saved; 2 more on (data,) = (8,): the
    4 steps of one device. Each run's first line names its own mesh."""
    run = str(tmp_path / "run")
    first = mesh_config(
        ("data", "fsdp", "tensor"), (2, 2, 2), checkpoint_every_steps=2, num_train_steps=2
    )
    trainer.train_and_evaluate(first, run)
    assert "mesh (data=2, fsdp=2, tensor=2) over 8 cpu devices" in capsys.readouterr().out
    result = trainer.train_and_evaluate(mesh_config(("data",), (8,)), run)
    assert "mesh (data=8) over 8 cpu devices" in capsys.readouterr().out
    losses = train_losses(run)
    np.testing.assert_allclose(losses, one_device[0], rtol=RTOL)
    assert max_rel_error(result.state.params, one_device[1].params) < RTOL


def test_a_new_axis_is_one_module(one_device):
    """tests/example_axis.py's `ring`, registered from here: (data, ring) = (2, 4) trains as
    one device does; --explain and the predictor read its collective-permutes unchanged."""
    example_axis.register()
    try:
        config = mesh_config(("data", "ring"), (2, 4))
        assert_equal(run_steps(config, 8), one_device)
        text = explain.explain(config)
        assert "ring       4  batch" in text and "collective-permute" in text
        assert "hybrid data 2 x ring 4" in text
        w = workload(config, 8)
        assert any(
            c.kind == "collective-permute" and c.axes == "ring"
            for c in w.chunks[0].collectives["step"]
        )
    finally:
        example_axis.unregister()
    with pytest.raises(ConfigError, match="not a mesh axis"):
        parallel.validate(mesh_config(("data", "ring"), (2, 4)), 8)


@pytest.mark.parametrize("names,sizes", [(("data", "fsdp"), (2, 4)), (("node", "data"), (2, 4))])
def test_predicted_collective_bytes_are_the_compiled_programs(names, sizes):
    """The predictor's per-step bytes by (kind, axes) are what the compiled step moves."""
    config = mesh_config(names, sizes)
    w = workload(config, 8)
    setup = run_setup.setup(config, jax.devices())
    report = analysis.report(setup.strategy, 16, timing=False)
    compiled = {f"{r[1]} {r[2]}": r[4] for r in report["collectives"] if r[2] != "none"}
    assert describe(w) == compiled


def test_the_planner_enumerates_fsdp_and_node_meshes():
    """16 devices on 2 nodes: meshes over data, fsdp, stage and tensor, and each again with
    node = 2 first; the trainer's refusals are counted, nothing compiles."""
    config = tiny_config(global_batch_size=64)
    valid, refused = plan.enumerate_candidates(config, 16, nodes=2)
    names = {c.name.split(" ")[0] for c in valid}
    assert "(fsdp=16)" in names and "(data=2,fsdp=8)" in names
    assert "(node=2,data=8)" in names and "(node=2,fsdp=8)" in names
    # every candidate but the one-device baseline uses the 16 devices; names are unique; node,
    # where present, is 2 and first
    used = [math.prod(c.mesh) for c in valid + [c for c, _ in refused]]
    assert used.count(1) == 1 and set(used) == {1, 16}
    assert len({c.name for c in valid}) == len(valid)
    assert all(c.axes.index("node") == 0 and c.mesh[0] == 2 for c in valid if "node" in c.axes)
    node = next(c for c in valid if c.name.startswith("(node=2,data=8)"))
    assert node.overrides() == {
        "mesh_axes": ("node", "data"),
        "mesh_shape": (2, 8),
        "sync.mode": "allreduce",
    }


def test_a_new_rules_axis_splits_the_names_it_declares():
    """A channel axis written as one registration, no model edit: a rules axis that declares
    the logical names it splits (conv_out, mlp). On (data, channel) = (2, 4), with the config's
    rules naming only tensor (absent, so unsplit), it trains as one device does (in float64,
    FLOAT64) and its convolution kernels are split over it."""
    axes.register(
        axes.Axis(
            "channel",
            "rules",
            "output channels of every layer",
            rules=(("conv_out", "channel"), ("mlp", "channel")),
        )
    )
    try:
        with jax.enable_x64(True):
            config = mesh_config(("data", "channel"), (2, 4), **FLOAT64)
            one = reference_run(mesh_config(("data",), (1,), **FLOAT64))
            assert_equal(run_steps(config, 8), one, RTOL64)
            setup = run_setup.setup(config, jax.devices())
        split = [spec for _, spec in _leaves(setup.strategy) if "channel" in str(spec)]
        assert split, "no parameter is split over the channel axis"
    finally:
        axes.unregister("channel")


@pytest.mark.parametrize(
    "names,sizes,extra,message",
    [
        (("data", "expert"), (4, 2), {}, "mesh_axes names 'expert', which is not a mesh axis"),
        (("data", "data"), (4, 2), {}, "names an axis twice"),
        (("data", "node"), (4, 2), {}, "the node axis must come first"),
        (("data", "fsdp"), (2, 2, 2), {}, "must be 2 integers, one per axis"),
        (("data", "fsdp"), (2, 4), {"sync.mode": "sharded"}, "runs with sync.mode=allreduce"),
        (("data", "fsdp"), (2, 4), {"optimizer.name": "lars"}, "elementwise optimizer"),
        (("data", "fsdp"), (3, 4), {}, "needs 12 devices but 8 are present"),
        (("node", "data"), (2, 4), {"sync.impl": "pmap"}, "maps over one axis"),
        (("fsdp", "tensor"), (4, 2), {"strategy": "data"}, "splits the batch only"),
    ],
)
def test_refusals_name_the_axes(names, sizes, extra, message):
    with pytest.raises(ConfigError) as info:
        parallel.validate(mesh_config(names, sizes, **extra), 8)
    assert message in str(info.value) and "\n" not in str(info.value)
