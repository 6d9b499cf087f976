"""What the input pipeline costs: the Prefetcher's per-batch host and wait times, the
input-bound verdict they lead to, the figures a training run reports, and the bench suite that
contrasts loaders."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import pytest

from jaxpar import console, metrics, trainer
from jaxpar import suites as suite_lib
from jaxpar.data import Prefetcher
from jaxpar.summary_record import InputCost, RunSummary, Throughput
from tests.util import override, reached_summary, tiny_config

PAUSE_S = 0.03  # what the slow side of a pipeline sleeps per batch
STEPS = 12
WARMUP = 3


def _consume(make_batch, step_s: float, put=lambda b: b, steps: int = STEPS):
    """Run a Prefetcher over `steps` batches with a loop that works `step_s` per step; return
    it and the loop's step times (as StepTimer takes them: end of one step to the next)."""
    times = []
    with Prefetcher(make_batch, put, 0, steps) as batches:
        last = time.perf_counter()
        for _ in batches:
            time.sleep(step_s)
            now = time.perf_counter()
            times.append(now - last)
            last = now
    return batches, times


def _slow(step):
    time.sleep(PAUSE_S)
    return {"step": step}


def test_a_slow_loader_makes_the_loop_wait_and_is_flagged_input_bound():
    """Each batch costs the host 60 ms (40 making it, 20 copying it), the loop works 40 ms a
    step: the loader sets the pace, 60 ms a step, of which the loop waits the other 20 ms, a
    third of its time. Each figure is held to its own value, apart from the others' (a sleep
    lasts at least what it asks, and on a busy machine a few ms more), so none can stand for
    another."""
    make_s, put_s, work_s = 0.04, 0.02, 0.04

    def make(step):
        time.sleep(make_s)
        return {"step": step}

    def put(batch):
        time.sleep(put_s)
        return batch

    batches, times = _consume(make, work_s, put, steps=8)
    stats = batches.stats
    assert len(stats.made) == len(stats.waited) == 8
    figures = metrics.input_pipeline(stats.made, stats.waited, times, 64, WARMUP)
    host = figures.input_s_per_step
    assert make_s + put_s <= host < make_s + put_s + 0.04
    assert put_s <= figures.input_put_s_per_step < put_s + 0.03
    # the loop waits for the loader's pace less its own work (the sleeps' excess included)
    assert (host - work_s) / 2 < figures.input_wait_s_per_step < host - work_s + 0.01
    assert figures.input_wait_share == pytest.approx(1 / 3, abs=0.2)
    assert figures.loader_images_per_sec == pytest.approx(64 / host)
    assert figures.input_bound is True  # a third of the step waiting: above 10%


def test_a_slow_loop_with_a_fast_loader_does_not_wait_and_is_not_input_bound():
    batches, times = _consume(lambda step: {"step": step}, step_s=PAUSE_S)
    stats = batches.stats
    figures = metrics.input_pipeline(stats.made, stats.waited, times, 64, WARMUP)
    assert figures.input_wait_s_per_step < 0.1 * PAUSE_S  # the queue was full every time
    assert figures.input_s_per_step < 0.1 * PAUSE_S
    assert figures.loader_images_per_sec > 10 * 64 / PAUSE_S
    assert figures.input_bound is False


def test_the_verdict_is_one_sentence_with_both_rates():
    summary = dataclasses.replace(
        reached_summary(10),
        throughput=Throughput(830.0, 0.077, 0.07, 0.08, 10),
        input_cost=InputCost(0.075, 0.01, 0.032, 0.42, 850.0, True),
    )
    assert metrics.input_line(summary) == (
        "input-bound: the loader makes 850 img/s, training consumed 830 img/s and waited for "
        "data 42.0% of its step time (input-bound: more than 10%)"
    )
    assert metrics.input_line(dataclasses.replace(summary, input_cost=None)) is None


def test_a_training_run_reports_what_its_input_cost(tmp_path):
    config = tiny_config(num_train_steps=6, log_every_steps=3, checkpoint_every_steps=0)
    config = override(config, {"model.name": "lenet", "model.width": 0.25})
    summary = trainer.train_and_evaluate(config, str(tmp_path), jax.devices()[:1]).summary
    cost = summary.input_cost
    assert cost.input_s_per_step > 0 and cost.loader_images_per_sec > 0
    assert 0 < cost.input_put_s_per_step <= cost.input_s_per_step
    assert 0 <= cost.input_wait_s_per_step < summary.throughput.step_time_median_s * 10
    assert isinstance(cost.input_bound, bool)
    assert cost.loader_images_per_sec == pytest.approx(16 / cost.input_s_per_step)
    with open(os.path.join(tmp_path, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [3, 6]
    assert all(r["input_s_per_step"] > 0 and r["input_wait_s_per_step"] >= 0 for r in train)
    assert "input_bound" in records[-1]
    assert "img/s" in console.summary_table(RunSummary.of_record(records[-1]))


def test_the_input_pipeline_suite_builds_every_row():
    suite = suite_lib.load_suite("input_pipeline")
    names = [r["name"] for r in suite.rows]
    assert len(names) == len(set(names))
    for r in suite.rows:
        config = suite_lib.row_config(suite, r, {})
        assert config.model.name == "lenet" and config.num_devices == config.mesh_shape[0]
        assert tuple(config.mesh_shape)[1:] == (1, 1) and config.mesh_shape[0] in (1, 2, 4, 8)
        assert r["baseline"] in names
