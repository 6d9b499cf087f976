"""`python -m jaxpar.plan --target-accuracy A`: the time-to-target pass of the command. The
reference run is read from --from-run, or trained here first (`calibrate`); the search runs
at each global batch, and its rows are ranked by predicted time to the target (to_target.py)
and printed (`rank_to_target`)."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxpar import configfile, oneline, trainer
from jaxpar.plan import calibrate_sync as calibrate_sync_lib
from jaxpar.plan import to_target
from jaxpar.plan.search import Plan, Search
from jaxpar.target import reading
from jaxpar.target.reference import Reference


@dataclasses.dataclass(frozen=True)
class ToTarget:
    """The time-to-target pass's result, as plan.json keeps it beside the plan."""

    accuracy: float
    reference: Reference
    ranking: to_target.Ranking

    def as_record(self) -> dict[str, Any]:
        return {
            "target_accuracy": self.accuracy,
            "reference": self.reference.as_record(),
            "to_target_rows": [r.as_record() for r in self.ranking.rows],
            "to_target_ranked": [r.name for r in self.ranking.ranked],
        }


def calibrate(config_file: str, config, overrides: dict, accuracy: float, out: Path):
    """Train the config itself to the target on this machine (stopping there), and read the
    reference from that run: the path without --from-run."""
    workdir = out / "calibration"
    print(
        f"\nno --from-run: training {config_file} to accuracy {accuracy:g} on this machine "
        f"first ({workdir}; up to {config.num_train_steps} steps)",
        flush=True,
    )
    run = configfile.override(
        config.copy_and_resolve_references(),
        {
            "target_accuracy": accuracy,
            "stop_at_target": True,
            "eval_every_steps": config.eval_every_steps or max(1, config.num_train_steps // 20),
            "checkpoint_every_steps": 0,
        },
    )
    trainer.train_and_evaluate(run, str(workdir))
    return reading.load(str(workdir), accuracy)


def calibrate_sync(config, pairs: str, accuracy: float, reference, out: Path):
    """--calibrate-sync: the sync modes' step factors measured on the config (paired runs to
    the target), kept beside the reference and returned in it."""
    out = out or Path(tempfile.mkdtemp(prefix="jaxpar-plan-"))
    record = calibrate_sync_lib.calibrate(
        config, calibrate_sync_lib.settings(pairs, config), accuracy, out
    )
    path = calibrate_sync_lib.store(record, reference)
    print("\n" + "\n".join(calibrate_sync_lib.table(record)) + f"\nkept in {path}", flush=True)
    return reading.load(reference.source, accuracy)


def rank_to_target(
    config,
    search: Search,
    result: Plan,
    accuracy: float,
    reference: Reference,
    batches: Sequence[int] = (),
    top: int = 5,
) -> ToTarget:
    """The time-to-target ranking over `batches` (default: around the reference's), the
    search at the config's batch being `result`: printed, with the `top` rows, and returned
    for plan.json."""
    batches = batches or to_target.default_batches(reference, config.global_batch_size)
    per_batch = max(8, search.max_candidates // len(batches))
    print(
        f"\ntime to accuracy {accuracy:g}, from {reference.source}: "
        f"{reference.describe()}; the steps at each batch are integrated along its noise "
        "trace (jaxpar/target/steps.py), a goodput schedule simulated on it",
        flush=True,
    )
    if caveat := reference.caveat():
        print(f"note: {caveat}")
    rows = []
    for b in batches:
        if b == config.global_batch_size:
            found = result
        else:
            at = configfile.override(config.copy_and_resolve_references(), {"global_batch_size": b})
            try:
                found = search.run(at, per_batch)
            except ValueError as e:
                print(f"batch {b}: {oneline.first_line(e)}")
                continue
        rows += to_target.rows_to_target(found.rows, b, reference, config, search.memory_limit)
    rows += to_target.schedule_rows(rows, reference, int(config.goodput.every_steps))
    ranking = to_target.rank(rows, config.global_batch_size)
    print("\n" + "\n".join(to_target.table(ranking.ranked, top)))
    print(to_target.verdict(ranking.ranked, ranking.pick))
    skipped = {r.sync_mode for r in rows if r.skipped_reason}
    if skipped:
        print(
            f"left out: {', '.join(sorted(skipped))} (no step factor for its setting: measure "
            "them on this model with --calibrate-sync)"
        )
    fallback = {r.sync_mode for r in rows if r.sync_factor_source == "LeNet/digits constants"}
    if fallback:
        print(
            f"note: the steps of {', '.join(sorted(fallback))} use step factors measured on "
            "LeNet and the digits (jaxpar/target/sync_factors.py), which need not hold for "
            "this model: --calibrate-sync measures its own"
        )
    return ToTarget(accuracy, reference, ranking)
