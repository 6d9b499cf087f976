"""What the bench's plots share: matplotlib (Agg), one marker per partitioning family, a row's
mesh and family, and how a figure is finished and written."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from jaxpar import axes
from jaxpar.bench.row_record import BenchRow

MIB = 2**20
# One marker per family of partitioning (`family`): "1 device", "hybrid", and each registered
# axis's label, in the registry's order of names.
_MARKERS = ("o", "v", "P", "X", "s", "^", "h", "<", ">", "p", "d")


def markers(rows: list[BenchRow]) -> dict[str, str]:
    """A marker for every family in `rows`: one each for a single device and hybrids, one per
    registered axis's label, and the rest in order for any other."""
    out = {"1 device": "*", "hybrid": "D"}
    spare = iter(_MARKERS)
    for label in [axes.get(a).label for a in axes.names()]:
        out.setdefault(label, next(spare, "o"))
    for fam in dict.fromkeys(family(r) for r in rows):
        if fam not in out:
            out[fam] = next(spare, "o")
    return out


def ok(rows: list[BenchRow]) -> list[BenchRow]:
    return [r for r in rows if r.status == "ok"]


def finish(fig, ax, path: str, title: str, legend_fontsize: float | None = None, **legend) -> bool:
    """Grid, legend and title on `ax`; write the figure to `path` and free it."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_fontsize, **legend)
    ax.set_title(title)
    return save(fig, path)


def save(fig, path: str) -> bool:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def mesh_of(r: BenchRow) -> dict[str, int]:
    """A row's mesh, {axis: size} (rows written before mesh_axes: (data, stage, tensor))."""
    sizes = r.mesh_shape or (1, 1, 1)
    names = r.mesh_axes or axes.DEFAULT
    return dict(zip(names, sizes))


def family(r: BenchRow) -> str:
    """ "1 device", one axis' word ("data", "pipeline", "tensor", "fsdp", "node", ...), or
    "hybrid"."""
    used = [a for a, n in mesh_of(r).items() if n > 1]
    if not used:
        return "1 device"
    if len(used) > 1:
        return "hybrid"
    return axes.get(used[0]).label if axes.registered(used[0]) else used[0]


def num_stages(r: BenchRow) -> int:
    shape = mesh_of(r)
    return axes.num_stages(shape) if all(axes.registered(a) for a in shape) else 1
