"""Pipeline partitioning computes the single-device function, with any split and schedule."""

import itertools

import jax
import numpy as np
import pytest

from jaxpar import trainer
from jaxpar.models.vgg import vgg
from jaxpar.parallel import schedules, stages
from tests.util import max_rel_error, reference_run, run_steps, tiny_config

RTOL = 1e-5
CASES = [("naive", k, 1) for k in (2, 4, 8)] + [
    (schedule, k, m) for schedule in ("gpipe", "1f1b") for k in (2, 4, 8) for m in (1, 2, 4, 8)
]


def pipeline_config(schedule, k, m, data=1, **overrides):
    return tiny_config(
        **{
            "mesh_shape": (data, k, 1),
            "pipeline.schedule": schedule,
            "pipeline.num_microbatches": m,
            **overrides,
        }
    )


@pytest.fixture(scope="module")
def reference():
    return reference_run(tiny_config())


@pytest.mark.parametrize("schedule,k,m", CASES, ids=[f"{s}-K{k}-M{m}" for s, k, m in CASES])
def test_pipeline_matches_single_device(reference, schedule, k, m):
    ref_losses, ref_state = reference
    losses, state = run_steps(pipeline_config(schedule, k, m), k)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert int(state.step) == 3
    # The canonical state is layout-free: the same layers as the single-device state.
    assert set(state.params) == set(ref_state.params)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_with_data_axis_and_params_split(reference, schedule):
    ref_losses, ref_state = reference
    config = pipeline_config(schedule, 4, 2, data=2, **{"pipeline.split": "params"})
    losses, state = run_steps(config, 8)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL


@pytest.mark.parametrize("schedule,data", [("gpipe", 1), ("1f1b", 2)])
def test_batch_norm_statistics_per_micro_batch(schedule, data):
    """With BatchNorm on, the pipeline equals the documented policy's reference: statistics
    per micro-batch (over all data replicas), running averages updated in micro-batch order."""
    overrides = {"model.batch_norm": True}
    reference_config = tiny_config(mesh_shape=(data, 1, 1), **overrides)
    ref_losses, ref_state = reference_run(reference_config, microbatches=4)
    losses, state = run_steps(pipeline_config(schedule, 4, 4, data=data, **overrides), 4 * data)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert max_rel_error(state.batch_stats, ref_state.batch_stats) < RTOL
    # ... and with one micro-batch it is exactly the single-device step.
    one_losses, _ = run_steps(pipeline_config(schedule, 4, 1, data=data, **overrides), 4 * data)
    np.testing.assert_allclose(one_losses, reference_run(tiny_config(**overrides))[0], rtol=RTOL)


def covers_each_layer_once(bounds, num_layers):
    layers = [i for a, b in itertools.pairwise(bounds) for i in range(a, b)]
    return layers == list(range(num_layers)) and all(b > a for a, b in itertools.pairwise(bounds))


@pytest.mark.parametrize("policy", ["uniform", "flops", "params", (1, 2, 18), (3, 10, 11)])
def test_every_split_covers_each_layer_once(policy):
    model = vgg("vgg19", (224, 224, 3), 1000)  # 19 layers over 4 stages
    bounds = stages.split(model, 4, policy)
    assert len(bounds) == 5 and covers_each_layer_once(bounds, 19)
    for k in (2, 3, 7, 19):  # up to one layer per stage
        for name in ("uniform", "flops", "params"):
            assert covers_each_layer_once(stages.split(model, k, name), 19)


def test_flops_and_params_balances_differ():
    model = vgg("vgg19", (32, 32, 3), 10)
    by_flops, by_params = stages.split(model, 4, "flops"), stages.split(model, 4, "params")
    assert by_flops != by_params

    def worst(bounds, cost):
        return max(
            sum(getattr(x, cost) for x in model.layers[a:b]) for a, b in itertools.pairwise(bounds)
        )

    # Each policy is optimal for its own cost, so it beats (or ties) the others on it.
    for other in ("uniform", "params"):
        assert worst(by_flops, "flops") <= worst(stages.split(model, 4, other), "flops")
    for other in ("uniform", "flops"):
        assert worst(by_params, "params") <= worst(stages.split(model, 4, other), "params")
    assert "MB sent/batch" in stages.stage_table(model, by_flops, 128)


@pytest.mark.parametrize(
    "k,policy,message",
    [
        (18, "uniform", "18 stages but vgg19 has 17 layers"),
        (4, (3, 3, 9), "must increase strictly"),
        (4, (3, 9), "needs 3 cut points"),
        (4, (0, 5, 9), "must increase strictly"),
        (4, (5, 9, 17), "must increase strictly"),
    ],
)
def test_bad_splits_are_refused(k, policy, message):
    model = vgg("vgg19", (32, 32, 3), 10)
    with pytest.raises(stages.SplitError, match=message) as info:
        stages.split(model, k, policy)
    assert "\n" not in str(info.value)


def test_stage_parameters_live_only_on_their_devices():
    config = pipeline_config("1f1b", 4, 2, data=2, **{"model.width": 0.25})
    s = trainer.setup(config, jax.devices())
    state = s.strategy.init_state(jax.random.key(0))
    stage_bytes = [
        4 * sum(x.params for x in s.model.layers[a:b])
        for a, b in zip(s.strategy.bounds, s.strategy.bounds[1:])
    ]
    per_device: dict = {}
    for stage in state.stages:
        for leaf in jax.tree.leaves(stage.params):
            for shard in leaf.addressable_shards:
                per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    assert len(per_device) == 8
    assert max(per_device.values()) <= 1.05 * max(stage_bytes)
    assert sum(per_device.values()) == 2 * sum(stage_bytes)  # each stage on its 2 replicas


def test_one_f_one_b_holds_fewer_activations_than_gpipe():
    """Peak stored activations per stage (measured from the live buffers during a step) at a
    fixed micro-batch size: GPipe grows with M, 1F1B stays at K - s."""
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        for m in (2, 4, 8):
            config = pipeline_config(schedule, 4, m, global_batch_size=4 * m)
            s = trainer.setup(config, jax.devices()[:4])
            state = s.strategy.init_state(jax.random.key(0))
            s.strategy.train_step(state, s.strategy.put_batch(trainer.local_train_batch(s, 0)))
            peaks[schedule, m] = s.strategy.peak_stash_bytes
    micro_bytes = 4 * 4 * 32 * 32 * 3  # one stage-0 input micro-batch: 4 images, float32
    for m in (2, 4, 8):
        assert peaks["gpipe", m][0] == m * micro_bytes
        assert peaks["1f1b", m][0] == min(4, m) * micro_bytes
    assert peaks["1f1b", 4] == peaks["1f1b", 8]
    assert peaks["gpipe", 8][0] == 2 * peaks["gpipe", 4][0]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("k,m", [(2, 1), (4, 4), (4, 8), (8, 3)])
def test_schedule_events_and_bubble(schedule, k, m):
    events = schedules.stage_events(schedule, k, m)
    for s, stage in enumerate(events):  # each micro-batch forwarded, backwarded once, F first
        assert sorted(stage) == sorted([(x, s, i) for x in "FB" for i in range(m)])
        assert all(stage.index(("F", s, i)) < stage.index(("B", s, i)) for i in range(m))
    if schedule == "1f1b":
        assert [schedules.in_flight(e) for e in events] == [min(k - s, m) for s in range(k)]
    else:
        assert all(schedules.in_flight(e) == m for e in events)
    # With equal stages, the idle fraction on the clock is the analytic (K-1)/(M+K-1).
    line = schedules.timeline(events, [1.0] * k, [2.0] * k)
    assert line.bubble == pytest.approx(schedules.analytic_bubble(k, m))
    order = schedules.dispatch_order(events)
    assert len(order) == 2 * k * m and len(set(order)) == len(order)
