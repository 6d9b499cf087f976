"""The pipeline runner's host time (`measure_host`). One Python thread dispatches every stage's
programs and the stage-to-stage transfers, on the cores the simulated devices compute on.
Measured: the CPU time of that thread per training step (time.thread_time, not the wall clock:
it does not count the waits) of the calibration run's model at a quarter of its width as a GPipe
pipeline of K = 2, 4, 8 stages of one device, K = 2, 4 of two and K = 2 of four (the mesh (D, K,
1)), over M = 1, 2, 4, 8 micro-batches; then the costs per stage, per micro-batch and per
program or transfer (2K - 1 programs and 2(K - 1) transfers per micro-batch, as the predictor
counts them), and what each further device of a stage adds per stage and per dispatch (every
argument is a buffer per device), that fit those times best, beside the profile's fixed
step_overhead_s. The quarter width leaves the devices' compute out of the thread's time as far
as it can: XLA:CPU runs part of a small program on the thread that calls it.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax
import numpy as np

from jaxpar import run_setup, units
from jaxpar.predict.calibrate import timer
from jaxpar.predict.profiles import solve
from jaxpar.predict.profiles.calibration_runs import run_config
from jaxpar.predict.profiles.records import CalibrationRun


def _dispatches(stages: int) -> int:
    """Programs and transfers the runner dispatches per micro-batch of a K-stage GPipe or 1F1B
    pipeline: a forward per stage but the last, a backward per stage, two transfers per
    boundary (model._pipeline_times counts the same)."""
    return (2 * stages - 1) + 2 * (stages - 1)


LAYOUTS = ((1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 2))  # (devices per stage, stages)


HOST_COSTS = (
    "stage_overhead_s",
    "stage_device_overhead_s",
    "microbatch_overhead_s",
    "program_overhead_s",
    "program_device_overhead_s",
)


def host_features(k: int, m: int, d: int = 1) -> list[float]:
    """What each of HOST_COSTS is paid for in one step of a K-stage pipeline over M
    micro-batches on D devices per stage: stages, stages x further devices, micro-batches,
    dispatches, dispatches x further devices."""
    p = m * _dispatches(k)
    return [k, k * (d - 1), m, p, p * (d - 1)]


def fit_host(points: list[tuple], step_s: float) -> dict[str, float]:
    """HOST_COSTS that fit (K, M[, D], host seconds per step) best in least squares, beside a
    fixed `step_s` per step; none below 0 (a cost the points cannot tell apart is 0)."""

    features = np.array([host_features(*p[:-1]) for p in points], float)
    target = np.array([p[-1] - step_s for p in points])
    return solve.nonnegative(HOST_COSTS, features, target).values


def host_seconds(costs: dict[str, float], k: int, m: int, d: int, step_s: float) -> float:
    """The runner's host time per step priced by `costs` (HOST_COSTS by name)."""
    return step_s + sum(costs[n] * f for n, f in zip(HOST_COSTS, host_features(k, m, d)))


def measure_host(
    run: CalibrationRun,
    layouts=LAYOUTS,
    microbatches=(1, 2, 4, 8),
    steps: int = 10,
    repeats: int = 3,
    stream=sys.stderr,
) -> list[tuple[int, int, int, float]]:
    """[(K, M, D, seconds)]: the dispatching thread's CPU time per training step of the run's
    model at a quarter of its width as a K-stage GPipe pipeline over M micro-batches, each
    stage's batch split over D devices (the mesh (D, K, 1)), for each (D, K) of `layouts`, the
    least of `repeats` runs of `steps` steps. A line per pipeline measured goes to `stream`
    (count, figure, ETA): the whole takes minutes."""

    total, started = len(layouts) * len(microbatches), time.perf_counter()

    most = max(d * k for d, k in layouts)
    if len(jax.devices()) < most:
        raise ValueError(
            f"measuring the pipeline's host time needs {most} devices, jax has {len(jax.devices())}"
        )
    out = []
    for d, k in layouts:
        for m in microbatches:
            config = run_config(dataclasses.replace(run, width=run.width / 4))
            config.mesh_shape = (d, k, 1)
            config.pipeline.schedule, config.pipeline.num_microbatches = "gpipe", m
            setup = run_setup.setup(config, jax.devices()[: d * k])
            state = setup.strategy.init_state(jax.random.key(0))
            batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, 0))

            step = timer.carrying(setup.strategy.train_step, state, batch)
            # the first call compiles; the dispatching thread's CPU time, the least repeat's
            timed = timer.measure(step, 0.0, calls=steps, repeats=repeats, window=None)
            best = timed.thread_s
            out.append((k, m, d, best))
            if stream is not None:
                eta = (time.perf_counter() - started) / len(out) * (total - len(out))
                print(
                    f"  host time {len(out)}/{total}: K={k} M={m} D={d} {best * 1e3:.2f} ms "
                    f"a step, ETA {units.clock(eta)}",
                    file=stream,
                    flush=True,
                )
    return out


def host_report(points: list[tuple], step_s: float) -> str:
    """The measured host times, the fitted costs and how well they carry."""
    costs = fit_host(points, step_s)
    lines = [
        (
            "pipeline runner's host time per step (dispatching thread's CPU time; GPipe, "
            "the run's model at a quarter of its width, D devices per stage):"
        )
    ]
    for *layout, t in points:
        k, m, d = (*layout, 1)[:3]
        fitted = host_seconds(costs, k, m, d, step_s)
        lines.append(
            f"  K={k} M={m} D={d}: {t * 1e3:.2f} ms (fitted {fitted * 1e3:.2f}, "
            f"{100 * (fitted / t - 1):+.0f}%)"
        )
    lines.append("  " + "; ".join(f"c.{n} = {v:.3g}" for n, v in costs.items()))
    return "\n".join(lines)
