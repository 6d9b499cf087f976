"""Pipeline efficiency (issue 12): backward from stored residuals (remat=False), interleaved
1F1B, ZB-H1 and ZB-V compute the single-device function; the schedules are data whose timeline
reproduces their analytic bubbles; residual programs recompute no forward.

The equality grid is representative rather than the full product (the full product of
schedule x remat x K x M x v is ~60 pipelines, each compiled and run): every new schedule and remat=False at K=2 and K=4 (remat=False without the B/W split at K=4
through interleaved, whose chunks run the same residual programs as 1F1B's stages), M=1 and M=8 and middle values
where a schedule behaves differently (M < K: ZB-H1's weight gradients cannot fill the ramp;
M = K and 2K: interleaved's groups of K), v=1 and v=2 (interleaved with v=1 is 1F1B's event
list, pinned by the schedule tests), remat=True with chunks, and one data-parallel case that
exercises residuals stacked per replica. GPipe with remat=False runs the same programs as
1F1B in another order. The schedule tests below run the full K x M x v product (cheap).
"""

import jax
import numpy as np
import pytest

from jaxpar import analysis, hlo, run_setup
from jaxpar.config import ConfigError
from jaxpar.parallel import schedules, validate
from tests.util import max_rel_error, reference_run, run_steps, tiny_config

RTOL = 1e-5
CASES = [  # (schedule, remat, K, M, v, data)
    ("1f1b", False, 2, 8, 1, 1),
    ("interleaved", True, 2, 2, 2, 1),
    ("interleaved", False, 4, 4, 2, 1),
    ("zb-h1", False, 2, 1, 1, 1),
    ("zb-h1", False, 2, 4, 1, 2),
    ("zb-h1", False, 4, 8, 1, 1),
    ("zb-v", False, 2, 2, 1, 2),  # two chunks per stage in a V, data replicas (test_zb_v.py)
]


def config_for(schedule, k, m, remat=False, v=1, data=1, **overrides):
    return tiny_config(
        **{
            "mesh_shape": (data, k, 1),
            "pipeline.schedule": schedule,
            "pipeline.num_microbatches": m,
            "pipeline.remat": remat,
            "pipeline.virtual_stages": v,
            **overrides,
        }
    )


@pytest.fixture(scope="module")
def reference():
    return reference_run(tiny_config())


@pytest.mark.parametrize(
    "schedule,remat,k,m,v,data", CASES, ids=["-".join(map(str, c)) for c in CASES]
)
def test_matches_single_device(reference, schedule, remat, k, m, v, data):
    ref_losses, ref_state = reference
    losses, state = run_steps(config_for(schedule, k, m, remat, v, data), k * data)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert set(state.params) == set(ref_state.params)  # canonical: layout-free, as ever


def test_batch_norm_micro_batch_policy_with_residuals():
    """With BatchNorm on, ZB-H1 (residual backward, B/W split) equals the documented policy's
    reference: statistics per micro-batch, running averages updated in micro-batch order."""
    overrides = {"model.batch_norm": True}
    ref_losses, ref_state = reference_run(tiny_config(**overrides), microbatches=2)
    losses, state = run_steps(config_for("zb-h1", 2, 2, **overrides), 2)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert max_rel_error(state.batch_stats, ref_state.batch_stats) < RTOL


def _setup(schedule, k, m, remat, **overrides):
    setup = run_setup.setup(config_for(schedule, k, m, remat, **overrides), jax.devices()[:k])
    state = setup.strategy.init_state(jax.random.key(0))
    batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, 0))
    return setup.strategy, state, batch


def _convs(strategy, state, batch, c):
    progs = analysis.programs(strategy, strategy.config.global_batch_size)
    return {
        p.name: hlo.count_ops(p.compiled.as_text(), "convolution") for p in progs if p.chunk == c
    }


def test_residual_backward_recomputes_no_forward():
    """Convolutions in the compiled programs, per chunk: the recomputing backward runs the
    forward's again; the residual backward runs exactly that many fewer; B + W = one backward,
    and W alone runs one per forward convolution (the weight gradient)."""
    remat, res, zb = (
        _setup(s, 2, 2, r) for s, r in (("1f1b", True), ("1f1b", False), ("zb-h1", False))
    )
    for c in range(2):
        a, b, z = _convs(*remat, c), _convs(*res, c), _convs(*zb, c)
        n = b["fwd_res"]
        assert n > 0 and a.get("fwd", n) == n
        assert b["bwd_res"] == a["bwd"] - n
        assert z["bwd_in"] + z["bwd_w"] == b["bwd_res"] and z["bwd_w"] == n


def _peaks(schedule, k, m, remat):
    strategy, state, batch = _setup(schedule, k, m, remat, global_batch_size=4 * m)
    state, _ = strategy.train_step(state, batch)  # donates the old state
    return strategy, state, batch, strategy.peak_stash_bytes


def test_stored_bytes_are_the_residuals_and_one_f_one_b_stays_flat():
    """Peak stored bytes per stage (measured from the live buffers) at a fixed micro-batch
    size. remat=False under 1F1B: in-flight micro-batches x one micro-batch's residuals (the
    fwd_res program's stored outputs), more than the stage input remat=True stores, and flat
    in M. ZB-H1 is flat in M too, within 1F1B's peak (stage 0's K micro-batches) plus the
    output gradients that B keeps for W. ZB-V's stored bytes are what its event walk says."""
    k = 2
    peaks = {}
    for schedule, remat in (("1f1b", True), ("1f1b", False), ("zb-h1", False), ("zb-v", False)):
        for m in (2, 4):
            strategy, _, _, peaks[schedule, remat, m] = _peaks(schedule, k, m, remat)
            # What the analysis reports (from shapes, no step run) is what the step stored.
            batch_size = strategy.config.global_batch_size
            assert strategy.stored_activation_bytes(batch_size) == peaks[schedule, remat, m]
            if (schedule, remat) == ("1f1b", False):
                progs = analysis.programs(strategy, strategy.config.global_batch_size)
                per_mb = [
                    analysis.per_device_bytes(p.args[1])  # what bwd_res is given
                    for p in progs
                    if p.name == "bwd_res"
                ]
                in_flight = [schedules.in_flight(e) for e in strategy.events]
                assert peaks[schedule, remat, m] == [n * b for n, b in zip(in_flight, per_mb)]
    # ZB-V's count of chunk activations is capped (2K per stage, the schedule test), but a
    # stage's two chunks store different bytes and their mix at the peak depends on M.
    for key in (("1f1b", True), ("1f1b", False), ("zb-h1", False)):
        assert peaks[(*key, 2)] == peaks[(*key, 4)]
    assert all(r > x for r, x in zip(peaks["1f1b", False, 4], peaks["1f1b", True, 4]))
    stage0 = peaks["1f1b", False, 4][0]
    assert peaks["zb-h1", False, 4][0] >= stage0
    assert max(peaks["zb-h1", False, 4]) < 2 * stage0


SCHEDULES = [
    ("gpipe", 1),
    ("1f1b", 1),
    ("interleaved", 1),
    ("interleaved", 2),
    ("zb-h1", 1),
    ("zb-v", 1),
]


@pytest.mark.parametrize("schedule,v", SCHEDULES, ids=[f"{s}-v{v}" for s, v in SCHEDULES])
@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_schedule_events_and_bubble(schedule, v, k, m):
    if v > 1 and m % k:
        pytest.skip("interleaved needs M a multiple of K (a ConfigError, tested below)")
    if schedule == "zb-v" and m % k:
        pytest.skip("zb-v needs M a multiple of K (a ConfigError, tested in test_zb_v.py)")
    events = schedules.stage_events(schedule, k, m, v)
    kinds = "FBW" if schedule.startswith("zb") else "FB"
    stage_of = schedules.placement(schedule, k, v)
    for s, stage in enumerate(events):  # every (kind, chunk, mb) once, in dependency order
        chunks = [c for c, d in enumerate(stage_of) if d == s]
        assert len(chunks) == (2 if schedule == "zb-v" else v)
        assert sorted(stage) == sorted((x, c, i) for x in kinds for c in chunks for i in range(m))
        for c in chunks:
            for i in range(m):
                order = [stage.index((x, c, i)) for x in kinds]
                assert order == sorted(order)
    if schedule == "zb-h1":  # 1F1B's peak (K on stage 0) on every stage, whatever M
        assert [schedules.in_flight(e) for e in events] == [min(k, m)] * k
    if schedule == "zb-v":  # 2K half-stage chunk activations: 1F1B's peak, K whole stages
        assert [schedules.in_flight(e) for e in events] == [2 * k] * k
    line = schedules.timeline(events)  # equal stages: F = B = W = 1 per stage
    assert line.bubble == pytest.approx(schedules.analytic_bubble(k, m, schedule, v))
    order = schedules.dispatch_order(events)
    pos = {e: j for j, e in enumerate(order)}
    assert len(order) == len(kinds) * k * m * len(stage_of) // k
    for e in order:  # the host never dispatches an event before what it waits on
        assert all(pos[d] < pos[e] for d in waits_on(e, len(stage_of)))


def waits_on(event, chunks: int) -> list:
    """What a pipeline's (kind, chunk, micro-batch) needs first: a forward, the previous
    chunk's forward; a backward (B: input gradient), its forward and the next chunk's
    backward; a weight gradient (W), its backward."""
    kind, c, i = event
    if kind == "F":
        return [("F", c - 1, i)] if c > 0 else []
    if kind == "W":
        return [("B", c, i)]
    return [("F", c, i), *([("B", c + 1, i)] if c + 1 < chunks else [])]


def test_zero_bubble_beats_one_f_one_b_and_renders():
    k, m = 4, 8
    zb = schedules.timeline(schedules.stage_events("zb-h1", k, m))
    one = schedules.timeline(schedules.stage_events("1f1b", k, m))
    # Idle time per stage falls to a third: (K-1)(F+B-W) against 1F1B's (K-1)(F+B+W).
    assert zb.makespan - 3 * m == pytest.approx((one.makespan - 3 * m) / 3)
    assert zb.bubble < schedules.analytic_bubble(k, m, "1f1b")
    text = schedules.render(schedules.stage_events("zb-h1", k, m))
    assert text.splitlines()[0].startswith("stage 0: F0 F1 F2 F3 B0 W0 F4")
    # ZB-V halves ZB-H1's idle time again: its ramp is K-1 chunks of half a stage.
    zv = schedules.timeline(schedules.stage_events("zb-v", k, m))
    assert zv.makespan - 3 * m == pytest.approx((zb.makespan - 3 * m) / 2)
    assert schedules.placement("zb-v", k) == (0, 1, 2, 3, 3, 2, 1, 0)
    assert "F0.2" in schedules.render(schedules.stage_events("interleaved", 2, 2, 2))


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"pipeline.schedule": "1f1b", "pipeline.virtual_stages": 2}, "needs pipeline.schedule"),
        (
            {
                "pipeline.schedule": "interleaved",
                "pipeline.virtual_stages": 2,
                "pipeline.num_microbatches": 2,
            },
            "multiple of the 4 stages",
        ),
        ({"pipeline.schedule": "zb-h1", "pipeline.remat": True}, "pipeline.remat=False"),
    ],
)
def test_bad_combinations_are_refused(overrides, message):
    config = tiny_config(**{"mesh_shape": (1, 4, 1), "pipeline.num_microbatches": 4})
    for key, value in overrides.items():
        section, leaf = key.split(".")
        config[section][leaf] = value
    with pytest.raises(ConfigError, match=message) as info:
        validate(config, 4)
    assert "\n" not in str(info.value)
