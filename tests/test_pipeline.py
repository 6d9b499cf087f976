"""Pipeline partitioning computes the single-device function, with any split and schedule."""

import itertools

import jax
import numpy as np
import pytest

from jaxpar import run_setup
from jaxpar.models.vgg import vgg
from jaxpar.parallel import schedules, stages
from jaxpar.step_report import StepReport
from tests.util import max_rel_error, reference_run, run_steps, tiny_config

RTOL = 1e-5
# Every schedule on every stage count K; GPipe and 1F1B each with every micro-batch count M and
# in each regime: one micro-batch, fewer than the stages (1F1B's warm-up never fills), as many,
# and more (its steady state). Each case compiles its own stage programs, so the full product
# of K and M would add 15 runs and no regime.
CASES = [("naive", k, 1) for k in (2, 4, 8)] + [
    ("gpipe", 4, 1),
    ("gpipe", 8, 2),
    ("gpipe", 8, 8),
    ("gpipe", 2, 4),
    ("1f1b", 2, 1),
    ("1f1b", 8, 2),
    ("1f1b", 8, 4),
    ("1f1b", 4, 4),
    ("1f1b", 2, 8),
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
    assert "to next, MiB/step" in stages.stage_table(model, by_flops, 128)


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
    setup = run_setup.setup(config, jax.devices())
    state = setup.strategy.init_state(jax.random.key(0))
    stage_bytes = [
        4 * sum(x.params for x in setup.model.layers[a:b])
        for a, b in zip(setup.strategy.bounds, setup.strategy.bounds[1:])
    ]
    per_device: dict = {}
    for stage in state.chunks:
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
            setup = run_setup.setup(config, jax.devices()[:4])
            state = setup.strategy.init_state(jax.random.key(0))
            setup.strategy.train_step(
                state, setup.strategy.put_batch(run_setup.local_train_batch(setup, 0))
            )
            peaks[schedule, m] = setup.strategy.peak_stash_bytes
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


def test_stage_to_stage_bytes_are_one_number_everywhere():
    """The stage table, --explain and the summary print one figure, the metric
    bytes_between_stages_per_step: activations forward + gradients back over every boundary,
    whole global batch, in MiB; the parameter layouts are in layer order with the stage that
    holds each; the hybrid is named by what it composes."""
    from jaxpar import console, explain, metrics, units

    config = pipeline_config(
        "1f1b", 2, 2, data=2, **{"model.name": "vgg13", "mesh_shape": (2, 2, 1)}
    )
    setup = run_setup.setup(config, jax.devices()[:4])  # builds; compiles nothing
    batch, cut = config.global_batch_size, setup.strategy.bounds[1]
    total = 2 * 4 * batch * setup.model.layers[cut - 1].activation_size  # float32, fwd + bwd
    assert setup.strategy.bytes_between_stages(batch) == total  # the metric's value
    shown = units.mib(total)
    text = explain.explain(config, jax.devices()[:4])
    table = text.splitlines()
    head = next(i for i, x in enumerate(table) if x.startswith("stage layers"))
    column = [float(x.split()[-1]) for x in table[head + 1 : head + 3]]
    assert f"{sum(column):.2f} MiB" == shown and table[head + 3].endswith(f"total {shown}")
    line = next(x for x in text.splitlines() if x.startswith("  " + metrics.STAGE_TO_STAGE_LABEL))
    assert f" {shown} " in line
    # each device receives its data share of one direction's activations (K = 2)
    line = next(x for x in text.splitlines() if "most one device receives" in x)
    assert f" {units.mib(total // 2 // 2)} " in line
    summary = metrics.summary(
        strategy=setup.strategy.name,
        mesh_shape=(2, 2, 1),
        steps=1,
        global_batch_size=batch,
        step_times=[1.0],
        warmup=0,
        compile_time_s=6.0299,
        wall_time_s=9.0,
        train={},
        evaluation={},
        num_params=1,
        flops_per_example=1.0,
        report=StepReport(bytes_between_stages_per_step=total),
    )
    line = next(
        x
        for x in console.summary_table(summary).splitlines()
        if x.startswith(metrics.STAGE_TO_STAGE_LABEL)
    )
    assert f" {shown} " in line
    # the hybrid by its composition; parameters in layer order (conv8 before conv10) with
    # the stage holding each
    assert "hybrid data 2 x pipeline 2 (1f1b), run by strategy pipeline" in text
    names = [x.split()[1] for x in text.splitlines() if "/kernel " in x]
    assert names == [f"conv{i}/Conv_0/kernel" for i in range(1, 11)] + ["fc1/Dense_0/kernel"]
    stage_of = {
        x.split()[1].split("/")[0]: int(x.split()[0]) for x in text.splitlines() if "/kernel " in x
    }
    assert stage_of == {layer.name: int(i >= cut) for i, layer in enumerate(setup.model.layers)}


def test_partitioning_names_what_the_mesh_composes():
    from jaxpar.parallel.strategy import partitioning

    mesh = lambda d, s, t: {"data": d, "stage": s, "tensor": t}
    assert partitioning(mesh(1, 1, 1)) == "1 device"
    assert partitioning(mesh(8, 1, 1), sync_mode="local_sgd") == "data parallel over 8 (local_sgd)"
    assert partitioning(mesh(1, 4, 1), "gpipe") == "pipeline over 4 stages (gpipe)"
    assert partitioning(mesh(1, 1, 8)) == "tensor parallel over 8"
    assert partitioning(mesh(2, 1, 4)) == "hybrid data 2 x tensor 4"
    assert (
        partitioning(mesh(2, 2, 2), "interleaved", chunks_per_stage=2)
        == "hybrid data 2 x pipeline 2 (interleaved, 2 chunks per stage) x tensor 2"
    )


def test_natural_order_reads_numbers():
    from jaxpar.explain import natural

    names = ["conv10/Conv_0", "conv8/Conv_0", "conv9/BatchNorm_0", "conv9/Conv_0", "fc1"]
    assert sorted(names, key=natural) == [
        "conv8/Conv_0",
        "conv9/BatchNorm_0",
        "conv9/Conv_0",
        "conv10/Conv_0",
        "fc1",
    ]


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-v"])
def test_zero_bubble_schedules_run_in_float64(schedule):
    """The split backward's loss cotangent takes the loss's dtype (it was a float32 constant:
    float64 runs failed to trace): ZB-H1 and ZB-V on 2 stages in float64 equal one device to
    1e-12."""
    settings = {"model.dtype": "float64", "pipeline.remat": False, "num_train_steps": 2}
    config = pipeline_config(schedule, 2, 2, **settings)
    with jax.enable_x64(True):
        losses, state = run_steps(config, 2)
        ref_losses, ref_state = reference_run(config, microbatches=2)
    assert state.params["conv1"]["Conv_0"]["kernel"].dtype == np.float64
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-12)
    assert max_rel_error(state.params, ref_state.params) < 1e-12
