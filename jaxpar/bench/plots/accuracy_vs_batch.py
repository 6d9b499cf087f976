"""accuracy_vs_batch.png: test error against global batch, one line per recipe (group)."""

from __future__ import annotations

from jaxpar.bench import accuracy
from jaxpar.bench.plots import common
from jaxpar.bench.plots.common import plt  # pyplot, with the Agg backend set
from jaxpar.bench.row_record import BenchRow


def accuracy_vs_batch(rows: list[BenchRow], path: str) -> bool:
    """Test error (1 - accuracy, log scale, so that 1.5% and 50% both read) against global
    batch, one line per recipe (group) with two batches or more; bars span the seeds' min-max;
    the published figures (a suite's `reference`) in black."""
    entries = [e for e in accuracy.study(common.ok(rows)) if e.accuracy is not None]
    batches = lambda es: {e.global_batch_size for e in es}
    lines = {}
    for e in entries:
        lines.setdefault(e.group, []).append(e)
    lines = {g: es for g, es in lines.items() if len(batches(es)) >= 2}
    if not lines:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for g, es in lines.items():
        es = sorted(es, key=lambda e: e.global_batch_size)
        x = [e.global_batch_size for e in es]
        y = [1 - e.accuracy for e in es]  # test error: 1.5% and 50% on one axis
        err = [
            [e.accuracy_max - e.accuracy for e in es],
            [e.accuracy - e.accuracy_min for e in es],
        ]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=g)
    refs = {}
    for es in lines.values():
        for e in es:
            if (ref := e.reference) is not None:
                lo, hi = ref if isinstance(ref, (list, tuple)) else (ref, ref)
                refs[e.global_batch_size] = (lo, hi)
    if refs:
        x = sorted(refs)
        mid = [1 - (refs[b][0] + refs[b][1]) / 2 for b in x]
        half = [(refs[b][1] - refs[b][0]) / 2 for b in x]
        ax.errorbar(
            x,
            mid,
            yerr=half,
            color="black",
            ls="--",
            marker="s",
            capsize=3,
            label="published (reference)",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = sorted(batches(entries))
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("global batch size (same number of epochs)")
    ax.set_ylabel("test error = 1 - accuracy (log scale)")
    return common.finish(fig, ax, path, "accuracy against batch size, per recipe", 8)
