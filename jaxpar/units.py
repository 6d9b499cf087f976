"""How numbers print, everywhere jaxpar prints them: one helper per kind of quantity, so the
same quantity reads the same in the progress lines, the summary, `--explain`, the stage table
and the bench.

- durations: `seconds` (3 significant digits in the unit that fits: "6.03 s", "584 ms",
  "27.7 us");
- learning rates and other small rates: `rate` (3 significant digits, always scientific:
  "5.00e-04", "5.00e-02");
- sizes: `mib` (binary MiB, 2 decimals: "4.00 MiB");
- meshes: `mesh` ("(2, 2, 2)", as configs write `mesh_shape`, whatever sequence it is given);
  `named_mesh` ("(data=2, stage=2, tensor=2)").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from jaxpar import axes

MIB = 2**20


def _three(value: float) -> str:
    """3 significant digits for 1 <= value < 1000 ("6.03", "58.4", "584"); wider numbers keep
    their integer digits ("1,234")."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def seconds(value: float | None) -> str:
    """A duration in the unit that keeps it between 1 and 1000: "6.03 s", "584 ms",
    "27.7 us", "1,234 s"; "n/a" when unknown."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0 s"
    sign, value = ("-" if value < 0 else ""), abs(value)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")):
        # the largest unit whose figure rounds to 1 or more (0.9996 s reads "1.00 s")
        if value / scale >= 0.9995 or unit == "ns":
            return f"{sign}{_three(value / scale)} {unit}"
    raise AssertionError("unreachable")


def clock(value: float) -> str:
    """A duration as a clock reads it, for elapsed times and ETAs: "04:07", "1:02:03";
    "--:--" when unknown."""
    if not math.isfinite(value):
        return "--:--"
    h, rem = divmod(round(value), 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def rate(value: float | None) -> str:
    """A learning rate: 3 significant digits in scientific notation ("5.00e-04")."""
    if value is None or not math.isfinite(value):
        return "n/a" if value is None else str(value)
    return f"{value:.2e}"


def mib(nbytes: float | None) -> str:
    """Bytes as binary MiB with 2 decimals: "4.00 MiB" ("n/a" when unknown)."""
    if nbytes is None:
        return "n/a"
    return f"{nbytes / MIB:,.2f} MiB"


def mesh(shape: Sequence[int] | None) -> str:
    """A mesh's sizes as configs write mesh_shape: "(2, 2, 2)" (a list from JSON too)."""
    if shape is None:
        return "n/a"
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def named_mesh(names: Sequence[str] | None, shape: Sequence[int] | None) -> str:
    """A mesh with its axes' names: "(data=2, stage=2, tensor=2)"; sizes alone without names
    (results written before mesh_axes existed are (data, stage, tensor))."""
    if shape is None:
        return "n/a"
    if not names:
        names = axes.DEFAULT if len(shape) == 3 else None
    if not names:
        return mesh(shape)
    return "(" + ", ".join(f"{n}={int(s)}" for n, s in zip(names, shape)) + ")"
