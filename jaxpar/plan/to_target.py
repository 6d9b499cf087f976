"""Rank candidates by predicted time to a target: predicted steps (jaxpar/target/: the
reference's noise trace) at each candidate's global batch and sync mode, times its predicted
step time on the profile.

The planner's throughput search (`search.plan`) runs once per global batch; every row that
fits the memory limit becomes a time-to-target row. What decides a row's place against the
winner is the larger of its two ratios to the winner's: the steps it needs, or its step time
(a row that does not fit is decided by memory).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from jaxpar.plan.records import PlanRow, TargetRow
from jaxpar.target import goodput
from jaxpar.target.reference import Reference
from jaxpar.target.sync_factors import sync_factor, sync_setting


def default_batches(reference: Reference, config_batch: int) -> list[int]:
    """The global batches tried: the reference's x 1/4, 1, 4, 16 and the config's own."""
    b0 = reference.batch_size
    return sorted({max(1, b0 // 4), b0, 4 * b0, 16 * b0, int(config_batch)})


def rows_to_target(
    rows: Sequence[PlanRow], batch: int, reference: Reference, config, limit: float
) -> list[TargetRow]:
    """Time-to-target rows of one batch's predicted rows (failed predictions and sync modes
    with no measured multiplier are left out, the latter with `skipped_reason`)."""
    out = []
    base_steps = reference.steps(batch)
    for r in rows:
        if not r.ok:
            continue
        cand, step_s = r.candidate, r.predicted.step_time_s
        mode = cand.sync if cand.replicas > 1 else "allreduce"
        setting = sync_setting(mode, config)
        factor = sync_factor(mode, setting, reference.sync_factors)
        row = TargetRow(
            name=f"B={batch} {r.name}",
            candidate=r.name,
            mesh_axes=list(cand.axes),
            mesh_shape=list(cand.mesh),
            global_batch_size=batch,
            sync_mode=mode,
            step_s=step_s,
            images_per_sec=batch / step_s,
            memory_bytes_per_device=r.predicted.memory_bytes_per_device,
            fits=r.predicted.memory_bytes_per_device <= limit,
            learning_rate=reference.learning_rate_at(batch),
        )
        if factor is None:
            why = f"no measured steps multiplier for {mode} at this setting"
            row = dataclasses.replace(row, skipped_reason=why)
        else:
            steps = base_steps * factor
            measured = (mode, setting) in reference.sync_factors
            row = dataclasses.replace(
                row,
                steps_to_target=steps,
                time_to_target_s=steps * step_s,
                sync_steps_factor=factor,
                sync_factor_source="exact"
                if factor == 1.0 and not measured
                else ("measured on this model" if measured else "LeNet/digits constants"),
            )
        out.append(row)
    return out


def schedule_rows(rows: Sequence[TargetRow], reference: Reference, every: int) -> list[TargetRow]:
    """The goodput schedule simulated on the predicted step times (target/goodput.py): every
    `every` steps the fitting exact-sync row with the most progress per second at the noise
    scale of the moment, B_noise following the reference's trace by progress. One row per
    partitioning moving over its batches, and one moving over every partitioning too; each
    keeps its phases (first step, batch, candidate)."""
    fitting = [r for r in rows if r.fits and r.sync_steps_factor == 1.0]
    out = []
    groups = {r.candidate: [] for r in fitting}
    for r in fitting:
        groups[r.candidate].append(r)
    if len(groups) > 1:
        groups["every partitioning"] = fitting
    for name, group in groups.items():
        batches = {r.global_batch_size for r in group}
        if len(batches) < 2:
            continue
        row = _simulated(name, group, reference, every)
        if len(row.schedule_phases) > 1:  # one that never moves is a fixed row again
            out.append(row)
    return out


def _simulated(
    name: str, group: Sequence[TargetRow], reference: Reference, every: int
) -> TargetRow:
    """One schedule row over `group`'s rows: each (batch, candidate) its own setup, the
    fastest sync mode where two share one."""
    by_setup: dict[goodput.Setup, TargetRow] = {}
    for r in group:
        key = goodput.Setup(r.global_batch_size, tuple(r.mesh_shape))
        if key not in by_setup or r.step_s < by_setup[key].step_s:
            by_setup[key] = r
    run = goodput.simulate(
        reference.trace,
        reference.base_batch,
        lambda s: by_setup[s].step_s,
        sorted(by_setup),
        every,
    )
    phases = [[step, s.batch, by_setup[s].candidate] for step, s in run.phases]
    last = by_setup[run.phases[-1][1]]
    return TargetRow(
        name=f"goodput schedule ({name})",
        candidate="goodput: " + ", then ".join(f"B={b} {c}" for _, b, c in phases),
        mesh_axes=last.mesh_axes,
        mesh_shape=last.mesh_shape,
        global_batch_size=last.global_batch_size,
        sync_mode="allreduce",
        step_s=run.seconds / run.steps,
        images_per_sec=sum(by_setup[s].images_per_sec for _, s in run.phases) / len(run.phases),
        memory_bytes_per_device=max(r.memory_bytes_per_device for r in by_setup.values()),
        fits=True,
        learning_rate=None,
        steps_to_target=run.steps,
        time_to_target_s=run.seconds,
        sync_steps_factor=1.0,
        schedule_phases=phases,
    )


@dataclasses.dataclass(frozen=True)
class Ranking:
    """Every row with `decided_by` set (in the order given), the rows that fit and have a
    prediction soonest first, and images/sec's pick: the fastest of those at the config's own
    batch, what the throughput ranking recommends."""

    rows: list[TargetRow]
    ranked: list[TargetRow]
    pick: TargetRow | None


def rank(rows: Sequence[TargetRow], config_batch: int) -> Ranking:
    """Rank `rows` by time to target. Each ranked row is decided against the winner, the
    winner against images/sec's pick, a row that does not fit by memory."""
    ok = sorted(
        (r for r in rows if r.fits and r.time_to_target_s is not None),
        key=lambda r: r.time_to_target_s,
    )
    at_config = [r for r in ok if r.global_batch_size == config_batch and not r.is_schedule]
    pick = max(at_config, key=lambda r: r.images_per_sec) if at_config else None
    decided = {id(r): decided_by(r, pick if r is ok[0] and pick else ok[0]) for r in ok}
    for r in rows:
        if not r.fits:
            decided[id(r)] = "memory"
    new = {
        id(r): dataclasses.replace(r, decided_by=decided[id(r)]) for r in rows if id(r) in decided
    }
    return Ranking(
        rows=[new.get(id(r), r) for r in rows],
        ranked=[new[id(r)] for r in ok],
        pick=new[id(pick)] if pick is not None else None,
    )


def decided_by(row: TargetRow, other: TargetRow) -> str:
    """Which factor separates `row`'s time to target from `other`'s: "steps" or "step time"
    (the larger log-ratio), or "same" when they are the same row or tie."""
    if row is other:
        return "same"
    steps = math.log(row.steps_to_target / other.steps_to_target)
    step = math.log(row.step_s / other.step_s)
    if abs(steps) < 1e-12 and abs(step) < 1e-12:
        return "same"
    return "steps" if abs(steps) >= abs(step) else "step time"


def table(ranked: Sequence[TargetRow], top: int) -> list[str]:
    """The ranked rows as a markdown table."""
    lines = [
        (
            "| rank | global batch | candidate | steps to target | step | time to target | "
            "img/s | decided by |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(ranked[:top], 1):
        lines.append(
            f"| {i} | {r.global_batch_size} | {r.candidate} | "
            f"{r.steps_to_target:,.0f} | {1e3 * r.step_s:.3f} ms | "
            f"{_duration(r.time_to_target_s)} | {r.images_per_sec:,.0f} | "
            f"{r.decided_by} |"
        )
    return lines


def verdict(ranked: Sequence[TargetRow], throughput_best: TargetRow | None) -> str:
    """One line: whether ranking by time to target changes the images/sec ranking's winner."""
    if not ranked:
        return "no candidate fits and has a prediction: nothing to rank"
    best = ranked[0]
    if throughput_best is None:
        return f"soonest to the target: {best.name} ({_duration(best.time_to_target_s)})"
    same = throughput_best.name == best.name
    if same:
        return (
            f"time to target picks what images/sec picks: {best.name} "
            f"({_duration(best.time_to_target_s)}); the batch's extra steps do not "
            "outweigh its step time here"
        )
    changed = []
    if best.global_batch_size != throughput_best.global_batch_size:
        changed.append("batch")
    if best.sync_mode != throughput_best.sync_mode:
        changed.append("sync mode")
    if best.candidate != throughput_best.candidate:
        changed.append("partitioning")
    ratio = throughput_best.time_to_target_s / best.time_to_target_s
    return (
        f"time to target changes the winner ({' and '.join(changed)}): {best.name} "
        f"reaches the target in {_duration(best.time_to_target_s)}, {ratio:.2f}x sooner "
        f"than images/sec's pick {throughput_best.name} "
        f"({throughput_best.images_per_sec:,.0f} img/s, "
        f"{_duration(throughput_best.time_to_target_s)}), decided by "
        f"{decided_by(throughput_best, best)}"
    )


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{1e3 * seconds:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
