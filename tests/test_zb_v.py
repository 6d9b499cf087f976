"""ZB-V (2K chunks in a V, backward split into B and W): the single-device function on two
meshes, the schedule as data (every event once, on the stage the placement says, in
dependency order, the analytic bubble on the clock, the least any schedule can reach), and
its stored activations (what the event walk says, one group of K micro-batches per stage).

Equality runs are the tiny VGG11 (9 layers: 8 chunks for K = 4) at global batch 12, so that
both micro-batch counts divide it: (1,2,1) with M = 6 (three groups: a group's weight
gradients free its activations while the next one forwards) and (1,4,1) with M = 4 (one
group; the V turns on stage 3). ZB-V with data replicas runs in test_pipeline_efficiency.py,
across two processes in test_multiprocess.py.
"""

import types

import jax
import numpy as np
import pytest

from jaxpar import analysis, run_setup
from jaxpar.config import ConfigError
from jaxpar.parallel import schedules, validate
from tests.util import max_rel_error, reference_run, tiny_config

RTOL = 1e-5
BATCH = 12
CASES = [(2, 6), (4, 4)]  # (K, M)


def config_for(k, m, **overrides):
    return tiny_config(
        **{
            "mesh_shape": (1, k, 1),
            "global_batch_size": BATCH,
            "pipeline.schedule": "zb-v",
            "pipeline.num_microbatches": m,
            "pipeline.remat": False,
            **overrides,
        }
    )


@pytest.fixture(scope="module")
def reference():
    return reference_run(tiny_config(global_batch_size=BATCH))


@pytest.fixture(scope="module")
def runs():
    """(K, M) -> (losses, canonical state, strategy after its last step), run once."""
    out = {}

    def run(k, m):
        if (k, m) not in out:
            config = config_for(k, m)
            setup = run_setup.setup(config, jax.devices()[:k])
            state = setup.strategy.init_state(jax.random.key(config.seed))
            losses = []
            for i in range(config.num_train_steps):
                batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, i))
                state, metrics = setup.strategy.train_step(state, batch)
                losses.append(float(metrics["loss"]))
            canonical = jax.device_get(setup.strategy.canonical(state))
            out[k, m] = np.array(losses), canonical, setup.strategy
        return out[k, m]

    return run


@pytest.mark.parametrize("k,m", CASES, ids=[f"K{k}-M{m}" for k, m in CASES])
def test_matches_single_device(reference, runs, k, m):
    ref_losses, ref_state = reference
    losses, state, strategy = runs(k, m)
    assert strategy.num_chunks == 2 * k and strategy.stage_of == schedules.placement("zb-v", k)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert set(state.params) == set(ref_state.params)


@pytest.mark.parametrize("k,m", CASES, ids=[f"K{k}-M{m}" for k, m in CASES])
def test_stored_bytes_are_one_group_per_stage(runs, k, m):
    """The bytes the step stored at its peak (measured from the live buffers) are what the
    analysis walks from shapes; and with K dividing M a stage holds one group: K micro-batches
    of each of its two chunks (2K chunk activations), plus at most K output gradients each
    that B keeps for W."""
    _, _, strategy = runs(k, m)
    peak = strategy.peak_stash_bytes
    assert strategy.stored_activation_bytes(BATCH) == peak
    assert [schedules.in_flight(e) for e in strategy.events] == [2 * k] * k
    progs = analysis.programs(strategy, BATCH)
    assert all(p.stage == strategy.stage_of[p.chunk] for p in progs)
    stash = {p.chunk: analysis.per_device_bytes(p.args[1]) for p in progs if p.name == "bwd_in"}
    kept = {p.chunk: analysis.per_device_bytes(p.args[2]) for p in progs if p.name == "bwd_w"}
    for s in range(k):
        a, b = s, 2 * k - 1 - s
        assert k * (stash[a] + stash[b]) <= peak[s]
        assert peak[s] <= k * (stash[a] + kept[a] + stash[b] + kept[b])


def test_stage_states_follow_the_v(runs):
    """Stage d's state is chunks d and 2K-1-d (what memory reports and explain.py group)."""
    _, _, strategy = runs(*CASES[0])
    fake = types.SimpleNamespace(chunks=tuple(range(4)), grad_acc=tuple("abcd"))
    assert strategy.stage_states(fake) == [[(0, "a"), (3, "d")], [(1, "b"), (2, "c")]]


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6, 8])
def test_schedule_events_and_bubble(k):
    stage_of = schedules.placement("zb-v", k)
    assert stage_of == (*range(k), *reversed(range(k)))
    for m in range(k, 4 * k + 1):
        events = schedules.stage_events("zb-v", k, m)
        for s, stage in enumerate(events):  # every (kind, chunk, mb) once, on its stage
            chunks = [c for c, d in enumerate(stage_of) if d == s]
            assert chunks == [s, 2 * k - 1 - s]
            assert sorted(stage) == sorted(
                (x, c, i) for x in "FBW" for c in chunks for i in range(m)
            )
            pos = {e: j for j, e in enumerate(stage)}
            for c in chunks:
                for i in range(m):
                    assert pos["F", c, i] < pos["B", c, i] < pos["W", c, i]
        assert [schedules.in_flight(e) for e in events] == [2 * k] * k
        line = schedules.timeline(events)  # equal chunks: F = B = W = 1/2 per chunk
        bubble = schedules.analytic_bubble(k, m, "zb-v")
        assert line.bubble == pytest.approx(bubble)
        zb_h1 = schedules.analytic_bubble(k, m, "zb-h1")
        if m % k == 0:  # the least possible: the last stage's first forward waits K-1 chunks
            assert 2 * line.makespan == pytest.approx(6 * m + k - 1)
            assert bubble == pytest.approx((k - 1) / (6 * m + k - 1))
            h1_line = schedules.timeline(schedules.stage_events("zb-h1", k, m))
            assert bubble < zb_h1 and line.bubble < h1_line.bubble
        else:  # a short last group (refused by the checks) idles more, never over ZB-H1
            assert bubble <= zb_h1 + 1e-12
        order = schedules.dispatch_order(events)
        done = {e: j for j, e in enumerate(order)}
        assert len(order) == 6 * k * m
        # the host never dispatches an event before what it waits on: a forward waits for the
        # chunk before's forward; B for its own forward and the chunk after's B; W for its B
        for kind, c, i in order:
            after = done[kind, c, i]
            if kind == "F" and c > 0:
                assert done["F", c - 1, i] < after
            if kind == "B":
                assert done["F", c, i] < after
                assert c == 2 * k - 1 or done["B", c + 1, i] < after
            if kind == "W":
                assert done["B", c, i] < after


def test_bubbles_beside_one_f_one_b_and_zb_h1():
    """Analytic bubbles with equal chunk times (F = B = W) at K=4, M=8 and K=2, M=4."""
    one = [schedules.analytic_bubble(k, m, "1f1b") for k, m in ((4, 8), (2, 4))]
    zb_h1 = [schedules.analytic_bubble(k, m, "zb-h1") for k, m in ((4, 8), (2, 4))]
    zb_v = [schedules.analytic_bubble(k, m, "zb-v") for k, m in ((4, 8), (2, 4))]
    assert one == pytest.approx([3 / 11, 1 / 5])
    assert zb_h1 == pytest.approx([3 / 27, 1 / 13])
    assert zb_v == pytest.approx([3 / 51, 1 / 25])


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"pipeline.num_microbatches": 6}, "must be a multiple of 4"),
        ({"pipeline.num_microbatches": 2}, "must be a multiple of 4"),
        ({"pipeline.virtual_stages": 2}, "needs pipeline.schedule=interleaved"),
        ({"pipeline.remat": True}, "pipeline.remat=False"),
    ],
)
def test_bad_combinations_are_refused(overrides, message):
    config = config_for(4, 8, global_batch_size=48, **overrides)
    with pytest.raises(ConfigError, match=message) as info:
        validate(config, 4)
    assert "\n" not in str(info.value)
