"""The accuracy study of a sweep: rows that are not throughput studies (scaling "none", as in
the batch_size suite), with the rows that repeat one setting under other seeds folded into one
line (mean, and the min-max spread), and the published figure beside it where the suite gives
one. Pure functions over the aggregated rows of jaxpar.bench.results (tested on known input).
"""

from __future__ import annotations

import re

from jaxpar.bench.records import AccuracyEntry
from jaxpar.bench.row_record import BenchRow


def study(rows: list[BenchRow]) -> list[AccuracyEntry]:
    """One entry per `label` (rows sharing a label are seeds of one setting), in suite order:
    group (the recipe), batch, devices, seeds run and ok, test accuracy mean/min/max, the
    train-split accuracy, train/test gap, final train loss, epochs, steps, seconds per epoch
    and the reference. Failed seeds are counted, not averaged."""
    seeds: dict[str, list[BenchRow]] = {}
    for r in rows:
        if r.scaling != "none":
            continue
        seeds.setdefault(r.label or r.name, []).append(r)
    return [_entry(label, of_label) for label, of_label in seeds.items()]


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _entry(label: str, rows: list[BenchRow]) -> AccuracyEntry:
    ok = [r for r in rows if r.status == "ok" and r.eval_accuracy is not None]
    first = rows[0]
    acc = [r.eval_accuracy for r in ok]
    return AccuracyEntry(
        label=label,
        group=first.group,
        global_batch_size=first.global_batch_size,
        num_devices=first.num_devices,
        seeds=len(rows),
        seeds_ok=len(ok),
        error=next((r.error for r in rows if r.status != "ok"), None),
        accuracy=_mean(acc),
        accuracy_min=min(acc) if acc else None,
        accuracy_max=max(acc) if acc else None,
        train_accuracy=_mean([r.train_eval_accuracy for r in ok]),
        gap=_mean([r.generalization_gap for r in ok]),
        final_loss=_mean([r.final_loss for r in ok]),
        epochs=ok[0].epochs if ok else None,
        steps=ok[0].steps if ok else None,
        seconds_per_epoch=_mean([r.seconds_per_epoch for r in ok]),
        reference=first.reference,
    )


def _f(v, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def reference_text(ref) -> str:
    """A published figure: one value, or a (low, high) range over its runs."""
    if ref is None:
        return ""
    if isinstance(ref, (list, tuple)):
        lo, hi = ref
        return f"{lo:.4f}" if lo == hi else f"{lo:.4f}-{hi:.4f}"
    return f"{ref:.4f}"


def failure_text(error: str | None) -> str:
    """A failed run in a few words: "diverged (nan at step 48)" for a run the trainer stopped
    for a non-finite loss, else the one-line error."""
    found = re.search(r"diverged: the loss \((\w+)\) is not finite at step (\d+)", error or "")
    return f"diverged ({found[1]} at step {found[2]})" if found else f"failed: {error}"


def accuracy_text(e: AccuracyEntry) -> str:
    """Mean test accuracy; with several seeds, the spread and how many ran."""
    if e.accuracy is None:
        return failure_text(e.error)
    text = f"{e.accuracy:.4f}"
    if e.seeds_ok > 1:
        text += f" ({e.accuracy_min:.4f}-{e.accuracy_max:.4f}, {e.seeds_ok} seeds)"
    if e.seeds_ok < e.seeds:
        text += f"; {e.seeds - e.seeds_ok} {failure_text(e.error)}"
    return text


def markdown(entries: list[AccuracyEntry], reference_name: str = "published") -> str:
    """The study in the source documents' table format, jaxpar's figures beside theirs."""
    head = (
        f"| recipe | batch | devices | test accuracy | {reference_name} | train accuracy "
        "(inference) | train - test gap | final train loss | epochs | steps | s/epoch [clock] |"
    )
    lines = [head, "|" + "---|" * 11]
    for e in entries:
        cells = [
            e.group,
            str(e.global_batch_size or ""),
            str(e.num_devices or ""),
            accuracy_text(e),
            reference_text(e.reference),
            _f(e.train_accuracy, ".4f"),
            _f(e.gap, "+.4f"),
            _f(e.final_loss, ".4f"),
            _f(e.epochs, ".0f"),
            str(e.steps or ""),
            _f(e.seconds_per_epoch, ".1f"),
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"
