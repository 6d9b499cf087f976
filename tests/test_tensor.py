"""Tensor (channel) partitioning and (data, stage, tensor) hybrids compute the single-device
function; each device holds its share of the parameters."""

import re

import jax
import numpy as np
import pytest

from jaxpar import config as config_lib
from jaxpar import run_setup
from tests.util import max_rel_error, reference_run, run_steps, tiny_config

RTOL = 1e-5
MESHES = [
    (8, 1, 1),
    (1, 8, 1),
    (1, 1, 8),
    (2, 2, 2),
    (4, 2, 1),
    (2, 4, 1),
    (1, 4, 2),
    (2, 1, 4),
    (4, 1, 2),
    (1, 2, 4),
]


def hybrid_config(mesh_shape, **overrides):
    """Width 1/8: every channel count (8 .. 64) divides by 8 tensor devices."""
    return tiny_config(
        **{
            "model.width": 0.125,
            "mesh_shape": mesh_shape,
            "pipeline.schedule": "1f1b",
            "pipeline.num_microbatches": 2,
            **overrides,
        }
    )


@pytest.fixture(scope="module")
def reference():
    return reference_run(hybrid_config((1, 1, 1)))


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
def test_every_factorisation_of_8_matches_single_device(reference, mesh_shape):
    ref_losses, ref_state = reference
    losses, state = run_steps(hybrid_config(mesh_shape), 8)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL


def test_tensor_split_with_synchronised_batch_norm():
    """Each channel's statistics stay with its shard and are taken over the global batch."""
    overrides = {"model.batch_norm": True}
    ref_losses, ref_state = reference_run(hybrid_config((1, 1, 1), **overrides))
    losses, state = run_steps(hybrid_config((2, 1, 4), **overrides), 8)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert max_rel_error(state.batch_stats, ref_state.batch_stats) < RTOL


@pytest.mark.parametrize("remat", [True, False], ids=["remat", "residuals"])
def test_tensor_stages_hand_on_activations_in_the_next_stages_layout(monkeypatch, remat):
    """A tensor-split stage's output and input gradient leave their programs whole over the
    tensor axis, in the layout the other stage takes them in: the move is device to device,
    not through the host (moving a channel-split array onto other devices' batch layout
    fetches it first, and blocks the runner until the stage is done)."""
    from jaxpar.parallel.pipeline import runner

    seen = []
    send = runner.Runner.send

    def recording(self, x, src, dst, chunk, rows):
        seen.append((src, dst, x.sharding.spec, self.pipe.batch_sharding[dst].spec))
        return send(self, x, src, dst, chunk, rows)

    monkeypatch.setattr(runner.Runner, "send", recording)
    losses, _ = run_steps(hybrid_config((1, 2, 2), **{"pipeline.remat": remat}), 4, steps=1)
    assert np.isfinite(losses).all()
    assert sorted({(src, dst) for src, dst, *_ in seen}) == [(0, 1), (1, 0)]
    assert all(spec == want for *_, spec, want in seen), seen


def per_device_param_bytes(state) -> dict:
    out: dict = {}
    stages = getattr(state, "stages", (state,))
    for st in stages:
        for leaf in jax.tree.leaves(st.params):
            for shard in leaf.addressable_shards:
                out[shard.device] = out.get(shard.device, 0) + shard.data.nbytes
    return out


@pytest.mark.parametrize("mesh_shape", [(1, 1, 8), (2, 1, 4), (4, 1, 2)])
def test_parameters_are_split_over_the_tensor_axis(mesh_shape):
    config = hybrid_config(mesh_shape, **{"model.width": 0.25, "model.batch_norm": True})
    setup = run_setup.setup(config, jax.devices())
    state = setup.strategy.init_state(jax.random.key(0))
    total = 4 * setup.model.num_params
    t = mesh_shape[2]
    small = 4 * 1000  # the replicated classifier (64 x 10 + 10) and such
    per_device = per_device_param_bytes(state)
    assert len(per_device) == 8
    assert max(per_device.values()) <= 1.05 * total / t + small
    # The conv kernels really are split by output channels.
    kernel = state.params["conv3"]["Conv_0"]["kernel"]
    assert kernel.addressable_shards[0].data.shape[-1] == kernel.shape[-1] // t


def test_channel_count_not_divisible_is_one_line_error():
    config = hybrid_config((1, 1, 8), **{"model.width": 1 / 16})  # conv1 has 4 channels
    with pytest.raises(config_lib.ConfigError) as info:
        run_setup.setup(config, jax.devices())
    message = str(info.value)
    assert re.search(r"conv1/Conv_0/(bias|kernel) has 4 along", message) and "\n" not in message


def test_explain_lists_the_collectives_of_a_known_model():
    from jaxpar import explain

    config = hybrid_config((8, 1, 1))
    text = explain.explain(config, jax.devices())
    setup = run_setup.setup(config, jax.devices())
    # Data parallel: exactly one all-reduce over "data", of the gradient plus three scalars
    # (the loss, the accuracy and the noise scale's mean of the replicas' squared norms).
    rows = [line.split() for line in text.splitlines() if line.startswith("  step ")]
    assert rows == [["step", "all-reduce", "data", "1", f"{4 * setup.model.num_params + 12:,}"]]
    assert any("conv3/Conv_0/kernel" in line and line.endswith("P()") for line in text.splitlines())

    text = explain.explain(hybrid_config((1, 1, 8)), jax.devices())
    kinds = {tuple(line.split()[1:3]) for line in text.splitlines() if line.startswith("  step ")}
    assert ("all-gather", "tensor") in kinds and not any(axis == "data" for _, axis in kinds)
    assert any(
        "conv3/Conv_0/kernel" in line and line.endswith("P(None, None, None, 'tensor')")
        for line in text.splitlines()
    )

    config = hybrid_config((1, 2, 1))
    text = explain.explain(config, jax.devices()[:2])
    setup = run_setup.setup(config, jax.devices()[:2])
    cut = setup.strategy.bounds[1]
    sent = 2 * 4 * config.global_batch_size * setup.model.layers[cut - 1].activation_size
    line = next(x for x in text.splitlines() if x.startswith("  stage-to-stage bytes / step"))
    assert f" {sent / 2**20:,.2f} MiB " in line  # the whole batch, forward and back


def test_worked_example_rule_trains_like_one_device():
    """configs/vgg19_conv_in.py: a new sharding rule is one config file."""
    from configs import vgg19_conv_in

    config = vgg19_conv_in.get_config()
    for key, value in hybrid_config((2, 1, 4)).items():
        if key not in ("mesh_shape", "tensor"):
            config[key] = value
    assert config.tensor.rules == (("conv_in", "tensor"),)
    ref_losses, ref_state = reference_run(config)
    losses, state = run_steps(config, 8)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    setup = run_setup.setup(config, jax.devices())
    kernel = setup.strategy.init_state(jax.random.key(0)).params["conv2"]["Conv_0"]["kernel"]
    # split by input channels (dimension 2 of HWIO), as one sharding (trailing Nones aside)
    want = jax.sharding.NamedSharding(setup.mesh, jax.sharding.PartitionSpec(None, None, "tensor"))
    assert kernel.sharding.is_equivalent_to(want, kernel.ndim)
    assert kernel.addressable_shards[0].data.shape[2] == kernel.shape[2] // 4
