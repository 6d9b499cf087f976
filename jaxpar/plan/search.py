"""The search: predict the candidates on a profile in rounds (`plan`), bounded by
`max_candidates`: round 1 predicts one default setting per mesh, round 2 expands the pipeline
settings (schedule, micro-batches, recomputation, virtual stages), the synchronisation mode
and the split of the best few meshes, round 3 combines the best of each. `rank` sorts what
fits from what does not.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from jaxpar.errors import ConfigError
from jaxpar.plan.candidates import (
    BASELINE,
    SCHEDULES,
    Candidate,
    default_of,
    enumerate_candidates,
)
from jaxpar.plan.predictions import Predictions
from jaxpar.plan.records import PlanRow
from jaxpar.plan.refusals import commonest
from jaxpar.predict import predict_config


@dataclasses.dataclass
class Plan:
    """Every candidate predicted (rows, in prediction order), the trainer's refusals, and the
    1-device baseline row."""

    rows: list[PlanRow]
    refused: list[tuple[Candidate, str]]
    baseline: PlanRow | None
    num_devices: int
    considered: int  # candidates the trainer accepts (predicted or not)
    skipped: int  # accepted but not predicted (not in round 2's meshes, or over the bound)
    meshes: int = 0  # meshes the trainer accepts
    meshes_unseen: int = 0  # of those, meshes round 1 did not reach (--max_candidates)


@dataclasses.dataclass(frozen=True)
class Search:
    """What the command line fixes for every search it runs (at the config's batch, then at
    each batch of the time-to-target pass): the profile, the devices, the memory limit and
    how wide to look."""

    profile: Any
    num_devices: int
    memory_limit: float  # bytes per device
    all_sync: bool = False
    splits: tuple[str, ...] = ("flops",)
    expand: int = 3
    max_candidates: int = 40
    axes: tuple[str, ...] | None = None

    def run(self, config: ml_collections.ConfigDict, max_candidates: int | None = None) -> Plan:
        """`plan` for `config` under these settings (`max_candidates` overrides the bound)."""
        return plan(
            config,
            self.profile,
            self.num_devices,
            self.all_sync,
            self.splits,
            self.expand,
            max_candidates or self.max_candidates,
            self.memory_limit,
            axes=self.axes,
        )


def _fast(row: PlanRow) -> float:
    return row.predicted.step_time_s if row.ok else math.inf


def plan(
    config: ml_collections.ConfigDict,
    profile,
    num_devices: int | None = None,
    all_sync: bool = False,
    splits: Sequence[str] = ("flops",),
    expand: int = 3,
    max_candidates: int = 40,
    memory_bytes: float | None = None,
    predict: Callable | None = None,
    log: Callable[[str], None] | None = None,
    axes: Sequence[str] | None = None,
) -> Plan:
    """Predict the candidates of `config` on `profile` in rounds, at most `max_candidates`
    predictions (the 1-device baseline included). `predict(config, profile) -> PredictedRow`
    defaults to jaxpar.predict.predict_config; `log` takes one progress line per prediction
    (default: on stderr, so that stdout stays the plan)."""
    predict = predict or predict_config
    n = num_devices or profile.device.num_devices
    if n > profile.device.num_devices:
        raise ConfigError(f"--devices {n}: profile {profile.name} has {profile.device.num_devices}")
    limit = profile.device.memory_bytes if memory_bytes is None else memory_bytes
    nodes = -(-n // max(profile.device.devices_per_node, 1))
    valid, refused = enumerate_candidates(config, n, all_sync, splits, nodes, axes)
    meshes = list(dict.fromkeys((c.axes, c.mesh) for c in valid if c != BASELINE or n == 1))
    if not meshes:
        (reason, _), *_ = commonest(refused, 1) or [("nothing to try", 0)]
        raise ConfigError(
            f"no partitioning of {n} devices runs this config (global_batch_size "
            f"{config.global_batch_size}); commonest refusal: {reason}"
        )
    by_mesh = {m: [c for c in valid if (c.axes, c.mesh) == m] for m in meshes}
    defaults = {m: default_of(config, by_mesh[m], all_sync) for m in meshes}
    say = log or (lambda s: print(s, file=sys.stderr, flush=True))
    found = Predictions(predict, config, profile, refused, limit, max_candidates, say)
    first = ([BASELINE] if n > 1 and BASELINE in valid else []) + list(defaults.values())
    found.run(first, "round 1")
    unseen = sum(d not in found.done for d in defaults.values())
    baseline = found.done.get(BASELINE) or (found.done.get(first[0]) if n == 1 else None)
    best = sorted(meshes, key=lambda m: _order(found.done.get(defaults[m]), limit))[:expand]
    found.run(_round_two(best, by_mesh, defaults), "round 2")
    found.run(_round_three(best, by_mesh, defaults, found.done), "round 3")
    rows = _add_speedups(found.rows, baseline, limit)
    return Plan(
        rows,
        refused,
        next((new for old, new in zip(found.rows, rows) if old is baseline), None),
        n,
        len(valid),
        len(valid) - len(found.done),
        len(meshes),
        unseen,
    )


def _order(row: PlanRow | None, limit: float) -> tuple[int, float]:
    """How round 1 ranks a mesh by its default's row: fitting first, then predicted step time."""
    if row is None or not row.ok:
        return (2, math.inf)
    p = row.predicted
    return (0 if p.memory_bytes_per_device <= limit else 1, p.step_time_s)


def _round_two(best: list, by_mesh: dict, defaults: dict) -> list[Candidate]:
    """Round 2: on each of the `best` meshes, the other synchronisation modes and splits of its
    default's pipeline, then its pipeline settings nearest the default's first; the meshes
    take turns."""
    lanes = []
    for m in best:
        d = defaults[m]
        knobs = [c for c in by_mesh[m] if c.sync == d.sync and c.split == d.split]
        syncs = [c for c in by_mesh[m] if _same_pipeline(c, d) and c.split == d.split]
        split_v = [c for c in by_mesh[m] if _same_pipeline(c, d, split=False) and c.sync == d.sync]
        near = lambda c, d=d: (
            abs(math.log2(c.microbatches or 1) - math.log2(d.microbatches or 1)),
            c.remat != d.remat,
            SCHEDULES.index(c.schedule) if c.schedule else 0,
            c.virtual,
        )
        lanes.append([c for c in syncs + split_v + sorted(knobs, key=near) if c != d])
    return _round_robin(lanes)


def _round_three(best: list, by_mesh: dict, defaults: dict, done: dict) -> list[Candidate]:
    """Round 3: on each of the `best` meshes, its fastest pipeline settings with its fastest
    synchronisation mode, where that pair is not predicted yet."""
    combos = []
    for m in best:
        mine = [(c, done[c]) for c in by_mesh[m] if done.get(c)]
        d = defaults[m]
        knob = min(
            (p for p in mine if p[0].sync == d.sync and p[0].split == d.split),
            key=lambda p: _fast(p[1]),
            default=(d, None),
        )[0]
        sync = min(
            (p for p in mine if _same_pipeline(p[0], d) and p[0].split == d.split),
            key=lambda p: _fast(p[1]),
            default=(d, None),
        )[0]
        combo = dataclasses.replace(knob, sync=sync.sync)
        if combo in by_mesh[m] and combo not in done:
            combos.append(combo)
    return combos


def _add_speedups(rows: list[PlanRow], baseline: PlanRow | None, limit: float) -> list[PlanRow]:
    """Each row with its speed-up over the 1-device baseline, and whether it fits `limit`."""
    base_step = baseline.predicted.step_time_s if baseline and baseline.ok else None
    return [
        dataclasses.replace(
            r,
            speedup=base_step / r.predicted.step_time_s if base_step and r.ok else None,
            fits_limit=r.ok and r.predicted.memory_bytes_per_device <= limit,
        )
        for r in rows
    ]


def _same_pipeline(a: Candidate, b: Candidate, split: bool = True) -> bool:
    same = (a.schedule, a.microbatches, a.remat, a.virtual) == (
        b.schedule,
        b.microbatches,
        b.remat,
        b.virtual,
    )
    return same and (not split or a.split == b.split)


def _round_robin(lanes: list[list]) -> list:
    out = []
    for i in range(max(map(len, lanes), default=0)):
        out += [lane[i] for lane in lanes if i < len(lane)]
    return out


def rank(rows: Sequence[PlanRow], memory_bytes: float) -> tuple[list[PlanRow], list[PlanRow]]:
    """(candidates that fit `memory_bytes` per device, fastest first; those that do not,
    fastest first). Failed predictions are in neither."""
    ok = sorted((r for r in rows if r.ok), key=lambda r: r.predicted.step_time_s)
    fitting = [r for r in ok if r.predicted.memory_bytes_per_device <= memory_bytes]
    return fitting, [r for r in ok if r.predicted.memory_bytes_per_device > memory_bytes]
