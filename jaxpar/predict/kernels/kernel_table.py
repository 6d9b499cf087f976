"""A GPU's matrix-kernel costs from published per-kernel timings of that GPU.

A profile fitted only to whole models' single-GPU images/sec leaves its class rates to stand
in for everything a step does, and a model left out of the fit is mispriced by the rates the
others fitted (`python -m jaxpar.predict --validate --profile configs/hardware/dgx1_p100.py`
reports each model left out; see docs/predict.md). Per-kernel timings pin the matrix kernels
by themselves. A profile's `kernel_benchmarks` names a table of convolution
shapes and their measured forward, input-gradient and filter-gradient times on its GPU
(configs/hardware/kernels/*.csv: DeepBench's for the P100); each of those kernels is read as
opclass reads the same convolution in a compiled step (FLOPs, bytes, Winograd or not, its
narrowest GEMM dimension), priced by the profile's own `device_time`, and `kernel_fit`
(default: compute_efficiency, conv3x3_efficiency, matmul_kernel_s) fitted to the times, each
kernel's relative error weighing the same. The profile's `fit` to whole models then solves
only what the table does not hold (the framework's per-kernel time, `kernel_s`, for the DGX-1).

Shapes whose input has fewer than opclass.THIN channels (an image's or a spectrogram's first
layer) are left out: cuDNN runs them with other kernels, which the profile prices apart
(thin_efficiency), and a model's step has one of them at most.
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from jaxpar import configfile
from jaxpar.errors import ConfigError
from jaxpar.predict.kernels import matrix, opclass
from jaxpar.predict.profiles import hardware, solve
from jaxpar.predict.step import pricing

DEFAULT_FIT = ("compute_efficiency", "conv3x3_efficiency", "matmul_kernel_s")
# the shapes --calibrate-here times on a GPU of one's own (vision_rows of this table)
SHIPPED = "configs/hardware/kernels/deepbench_p100.csv"
_COLUMNS = (
    "W",
    "H",
    "C",
    "N",
    "K",
    "R",
    "S",
    "pad_h",
    "pad_w",
    "stride_h",
    "stride_w",
    "forward_ms",
    "input_grad_ms",
    "filter_grad_ms",
)


@dataclasses.dataclass(frozen=True)
class ConvRow:
    """One convolution shape of a table (DeepBench's names: input W x H x C, batch N, K
    output features, an R x S window) and its kernels' measured milliseconds (0: not timed)."""

    w: int
    h: int
    c: int
    n: int
    k: int
    r: int
    s: int
    pad_h: int
    pad_w: int
    stride_h: int
    stride_w: int
    forward_ms: float = 0.0
    input_grad_ms: float = 0.0
    filter_grad_ms: float = 0.0

    @property
    def shape(self) -> ConvRow:
        """The shape alone, its times 0."""
        return dataclasses.replace(self, forward_ms=0.0, input_grad_ms=0.0, filter_grad_ms=0.0)

    @property
    def out_hw(self) -> tuple[int, int]:
        """(P, Q): the output's height and width."""
        p = (self.h + 2 * self.pad_h - self.r) // self.stride_h + 1
        return p, (self.w + 2 * self.pad_w - self.s) // self.stride_w + 1

    def as_record(self) -> dict[str, float]:
        """The row as the table's columns."""
        return dict(zip(_COLUMNS, dataclasses.astuple(self)))

    @classmethod
    def of_record(cls, row: dict[str, Any]) -> ConvRow:
        """A row from the table's columns (a CSV line's strings or numbers; times optional)."""
        shape = [int(float(row[c])) for c in _COLUMNS[:11]]
        return cls(*shape, *(float(row.get(c, 0.0)) for c in _COLUMNS[11:]))


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One timed kernel, as opclass reads it, and its measured seconds."""

    name: str  # e.g. "3x3 s1 56x56x64->64 n16 forward"
    matmul: opclass.Matmul
    seconds: float


def load(path: str | Path) -> list[ConvRow]:
    """The table's rows; '#' lines are comments."""
    full = Path(path) if Path(path).is_absolute() else Path(configfile.ROOT, path)
    if not full.is_file():
        raise ConfigError(f"no kernel benchmark table {str(path)!r}")
    with full.open() as f:
        reader = csv.DictReader(line for line in f if not line.startswith("#"))
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ConfigError(f"kernel benchmark table {str(path)!r} has no column {missing[0]!r}")
        try:
            return [ConvRow.of_record(row) for row in reader]
        except (TypeError, ValueError) as e:
            raise ConfigError(f"kernel benchmark table {str(path)!r}: {e}") from None


def kernels(row: ConvRow, bytes_per_element: int = 4) -> list[Kernel]:
    """A convolution's three training kernels as opclass reads them in a compiled step.

    FLOPs 2 x N x P x Q x K x C x R x S for each (the input gradient of a strided convolution
    skips its dilation's zeros: the same count). Winograd: a 3x3 or 5x5 stride-1 window, for
    all three (the input gradient is a stride-1 convolution of that window, the filter
    gradient's result has that window's shape). GEMM views: forward M = N x P x Q, N = K,
    K = C x R x S; input gradient M = N x H x W, N = C, K = K x R x S; filter gradient M = K,
    N = C x R x S, K = N x P x Q."""
    w, h, c, n, k, r, s = row.w, row.h, row.c, row.n, row.k, row.r, row.s
    p, q = row.out_hw
    if c < opclass.THIN or p <= 0 or q <= 0:
        return []
    flops = 2.0 * n * p * q * k * c * r * s
    stride1 = row.stride_h == row.stride_w == 1
    winograd = stride1 and r == s and str(r) in matrix.WINOGRAD
    x_bytes, y_bytes, w_bytes = (
        bytes_per_element * v for v in (n * h * w * c, n * p * q * k, k * c * r * s)
    )
    moved = float(x_bytes + y_bytes + w_bytes)
    label = f"{r}x{s} s{row.stride_h} {w}x{h}x{c}->{k} n{n}"
    views = (
        ("forward", row.forward_ms, (n * p * q, k, c * r * s)),
        ("input gradient", row.input_grad_ms, (n * h * w, c, k * r * s)),
        ("filter gradient", row.filter_grad_ms, (k, c * r * s, n * p * q)),
    )
    tile = min(n * p * q, c, k)  # each tap's features through the tiles (Matmul.tile)
    return [
        Kernel(
            f"{label} {kind}",
            opclass.Matmul(flops, moved, winograd, min(dims), tile=tile),
            ms * 1e-3,
        )
        for kind, ms, dims in views
        if ms > 0
    ]


def measured(rows: list[ConvRow]) -> dict[tuple, tuple]:
    """Every timed kernel of the table by its layer and view less the batch, as
    opclass.conv_keys names a convolution of a compiled step without its first element: {(H,
    W, C, K, R, S, stride_h, stride_w, P, Q, kind): ((N, seconds, Matmul as kernels() reads
    it), ...)}. A profile prices a step's kernel of a batch timed here at its measured time,
    and of another batch at the nearest timed batch's time scaled by its own price over that
    kernel's (pricing.device_time). Thin first layers are left out, as kernels() leaves them."""
    out: dict[tuple, list] = {}
    for row in rows:
        (p, q), n = row.out_hw, row.n
        for kernel in kernels(row):
            kind = next(x for x in opclass.KINDS if kernel.name.endswith(x))
            key = (row.h, row.w, row.c, row.k, row.r, row.s, row.stride_h, row.stride_w, p, q)
            out.setdefault((*key, kind), []).append((n, kernel.seconds, kernel.matmul))
    return {key: tuple(sorted(v, key=lambda t: t[0])) for key, v in out.items()}


def price(profile: Any, kernel: Kernel, dtype: str = "float32") -> float:
    """Seconds the profile gives one kernel alone (its device_time of that kernel)."""
    m = kernel.matmul
    ops = opclass.OpClasses(
        conv3x3_flops=m.flops if m.winograd else 0.0,
        matmul_flops=0.0 if m.winograd else m.flops,
        matmuls=(m,),
    )
    return pricing.device_time(profile, ops, dtype)


@dataclasses.dataclass(frozen=True)
class KernelFit:
    profile: Any  # hardware.Profile
    errors: list[tuple[Kernel, float]]  # each kernel's priced / measured - 1

    @property
    def median_error(self) -> float:
        return statistics.median(abs(e) for _, e in self.errors)

    @property
    def total_ratio(self) -> float:
        """The table's total priced time over its total measured time."""
        priced = sum(k.seconds * (1 + e) for k, e in self.errors)
        return priced / sum(k.seconds for k, _ in self.errors)


def fit(
    profile: Any,
    rows: list[ConvRow],
    names: tuple[str, ...] = DEFAULT_FIT,
    dtype: str = "float32",
) -> KernelFit:
    """The profile's `names` costs least-squares fitted (in log space) to the table's kernel
    times, each kernel's relative error weighing the same. Needs a GPU profile with a memory
    bandwidth (`compiler = "gpu"`): only there does device_time price each matrix kernel."""

    if profile.device.compiler != "gpu" or not profile.memory.memory_bandwidth:
        raise ConfigError(
            f"profile {profile.name}: kernel_benchmarks needs compiler = 'gpu' "
            "and a memory_bandwidth (each matrix kernel priced on its own)"
        )
    table = [k for row in rows for k in kernels(row)]
    if len(table) < len(names):
        raise ConfigError(
            f"profile {profile.name}: the kernel benchmark table holds "
            f"{len(table)} kernels, fewer than the {len(names)} costs to fit"
        )
    measured = np.array([k.seconds for k in table])
    start = {
        "compute_efficiency": 0.5,
        "conv3x3_efficiency": 1.0,
        "matmul_kernel_s": 2e-5,
        "narrow_width": 16.0,
    }

    def residuals(values: dict[str, float]):
        p = hardware.replace(profile, **values)
        return np.array([price(p, k, dtype) for k in table]) / measured - 1

    given = {n: hardware.value(profile, n) or start.get(n, 1e-5) for n in names}
    best = solve.least_squares(residuals, given).values  # unbounded, as fitted so far
    fitted = hardware.replace(profile, **best)
    return KernelFit(fitted, list(zip(table, residuals(best).tolist())))


def vision_rows(rows: list[ConvRow], limit: int = 24) -> list[ConvRow]:
    """The table's image layers worth timing on a device of one's own: square inputs of at
    least THIN channels and a batch of at least 8, the first `limit` of them (a GPU compiles
    three programs a shape)."""
    picked = [r for r in rows if r.w == r.h and r.c >= opclass.THIN and r.n >= 8]
    return picked[:limit]


def write(path: str | Path, rows: list[ConvRow], header: str) -> None:
    """A kernel table in load()'s format: `header` as comment lines, then the rows."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines.append(",".join(_COLUMNS))
    for r in rows:
        values = dataclasses.astuple(r)
        lines.append(
            ",".join(str(int(v)) if i < 11 else f"{float(v):.4g}" for i, v in enumerate(values))
        )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
