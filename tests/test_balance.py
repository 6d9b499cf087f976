"""Pipeline stages balanced by measured time: the exact dynamic program against brute force,
and the profiling pass's cache (reused on resume, measured again when what it timed changes)."""

from __future__ import annotations

import itertools
import json
import os
import random
from types import SimpleNamespace

import jax
import pytest

from jaxpar import run_setup
from jaxpar.parallel import stages
from jaxpar.parallel.pipeline import balance, microbatches
from tests.util import tiny_config


def brute_force(costs, k, boundary):
    """The smallest largest-stage cost over every way to cut `costs` into k stages."""
    n, best = len(costs), float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        worst = max(
            sum(costs[a:b]) + (boundary[b - 1] if b < n else 0)
            for a, b in itertools.pairwise(bounds)
        )
        best = min(best, worst)
    return best


def balanced(costs, k, boundary=None):
    """stages.split's cut of layers costing `costs` into k stages: their measured times with
    `boundary` what sending each layer's output costs, or without it their FLOPs."""
    if boundary is None:
        layers = [SimpleNamespace(flops=c) for c in costs]
        return stages.split(_model(layers, None), k, "flops")
    times = SimpleNamespace(layer_costs=lambda: costs, boundary_costs=lambda: boundary)
    return stages.split(_model(costs, times), k, "time")


def _model(layers, times):
    """What stages.split reads of a SequentialModel."""
    return SimpleNamespace(name="m", layers=layers, times=times, uncuttable=None)


def stage_costs(bounds, costs, boundary):
    n = len(costs)
    return [
        sum(costs[a:b]) + (boundary[b - 1] if b < n else 0) for a, b in itertools.pairwise(bounds)
    ]


def test_time_split_is_optimal_against_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(2, 9)
        k = rng.randint(1, n)
        costs = [rng.uniform(0.1, 5.0) for _ in range(n)]
        boundary = [rng.uniform(0.0, 1.0) for _ in range(n)]
        bounds = balanced(costs, k, boundary)
        assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == k + 1
        assert all(a < b for a, b in itertools.pairwise(bounds))  # every layer once, none empty
        assert max(stage_costs(bounds, costs, boundary)) == pytest.approx(
            brute_force(costs, k, boundary)
        )


def test_time_split_handles_a_layer_heavier_than_the_ideal_stage():
    """One layer costs more than a quarter of the total: it gets a stage to itself and the
    rest is balanced around it; a costly send moves the cut where the activation is small."""
    costs = [1, 1, 20, 1, 1, 1, 1]
    bounds = balanced(costs, 4)
    assert (2, 3) in list(itertools.pairwise(bounds))  # the heavy layer alone
    assert max(stage_costs(bounds, costs, [0] * 7)) == 20
    # Equal layers, but sending layer 1's output costs 10: the even cut after it is avoided.
    bounds = balanced([1, 1, 1, 1], 2, [0, 10, 0, 0])
    assert bounds != (0, 2, 4) and max(stage_costs(bounds, [1] * 4, [0, 10, 0, 0])) == 3


def test_time_split_without_measured_times_is_refused_in_one_line():
    config = tiny_config(**{"pipeline.split": "time", "mesh_shape": (1, 2, 1)})
    setup = run_setup.setup(tiny_config(mesh_shape=(1, 2, 1)), jax.devices()[:2])
    with pytest.raises(stages.SplitError, match="measured times") as info:
        stages.split(setup.model, 2, config.pipeline.split)
    assert "\n" not in str(info.value)


def test_layer_times_are_cached_and_measured_again_when_the_shape_changes(tmp_path, capsys):
    keys = {
        "pipeline.split": "time",
        "mesh_shape": (1, 2, 1),
        "global_batch_size": 8,
        "pipeline.num_microbatches": 2,
        "model.width": 1 / 32,
    }
    workdir = str(tmp_path)
    first = run_setup.setup(tiny_config(**keys), jax.devices()[:2], workdir)
    times = first.model.times
    assert times.source == "measured" and times.rows == 4 and times.profile_s > 0
    n = len(first.model.layers)
    assert len(times.forward) == len(times.send) == n
    assert all(t > 0 for t in times.forward + times.forward_backward)
    # The cut minimises the slower stage, against every 2-stage cut tried here (brute_force):
    # a layer costs its forward and its forward + backward (remat recomputes the forward)
    # less the per-program cost of the timed programs; the first stage also sends its last
    # activation forward and receives its gradient back.
    d = times.dispatch
    assert times.remat  # configs/base.py's pipeline.remat
    costs = [max(f - d, 0) + max(fb - d, 0) for f, fb in zip(times.forward, times.forward_backward)]
    boundary = [2 * s for s in times.send]
    assert max(stage_costs(first.strategy.bounds, costs, boundary)) == pytest.approx(
        brute_force(costs, 2, boundary)
    )
    saved = json.load(open(os.path.join(workdir, balance.CACHE_FILE), encoding="utf-8"))
    assert saved["key"]["rows"] == 4 and saved["forward"] == list(times.forward)
    assert "timed" in capsys.readouterr().out

    again = run_setup.setup(tiny_config(**keys), jax.devices()[:2], workdir)  # a resumed run
    assert again.model.times.source.endswith(balance.CACHE_FILE)
    assert again.model.times.forward == times.forward
    assert again.strategy.bounds == first.strategy.bounds
    assert "reused" in capsys.readouterr().out

    other = run_setup.setup(
        tiny_config(**{**keys, "pipeline.num_microbatches": 4}), jax.devices()[:2], workdir
    )
    assert other.model.times.source == "measured" and other.model.times.rows == 2
    # Predicted chunk times: every layer counted once, sends only between chunks.
    chunk = other.model.times.chunk_times(other.strategy.bounds)
    costs = other.model.times.layer_costs()
    b = other.strategy.bounds[1]
    sends = other.model.times.boundary_costs()[b - 1]
    assert sum(chunk) == pytest.approx(sum(costs) + sends + 4 * other.model.times.dispatch)


def test_micro_batch_candidates_follow_the_batch_and_schedule():
    config = tiny_config(**{"global_batch_size": 48, "pipeline.schedule": "1f1b"})
    assert microbatches.candidate_microbatches(config, 2, 2) == [1, 2, 3, 4, 6, 8, 12, 24]
    config.pipeline.schedule = "interleaved"
    assert microbatches.candidate_microbatches(config, 2, 4) == [4, 8, 12, 24]
    config.eval_batch_size = 16  # every eval micro-batch needs whole rows per replica too
    assert microbatches.candidate_microbatches(config, 2, 4) == [4, 8]


def test_auto_micro_batches_are_chosen_once_and_kept_on_resume(tmp_path, capsys):
    keys = {
        "mesh_shape": (1, 2, 1),
        "global_batch_size": 8,
        "pipeline.schedule": "1f1b",
        "pipeline.num_microbatches": 0,
        "model.width": 1 / 32,
    }
    config = tiny_config(**keys)
    setup = run_setup.setup(config, jax.devices()[:2], str(tmp_path))
    m = setup.strategy.num_microbatches
    assert m in microbatches.candidate_microbatches(config, 1, 2)
    assert setup.config.pipeline.num_microbatches == m and config.pipeline.num_microbatches == 0
    said = capsys.readouterr().out
    assert f"chose M={m}" in said and "M=8:" in said  # every candidate's predicted step shown
    again = run_setup.setup(tiny_config(**keys), jax.devices()[:2], str(tmp_path))
    assert again.strategy.num_microbatches == m
    assert "chosen by the first run" in capsys.readouterr().out
