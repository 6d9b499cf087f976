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

import collections
import csv
import dataclasses
import statistics
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxpar import configfile, models
from jaxpar.errors import ConfigError
from jaxpar.predict.kernels import matrix, opclass
from jaxpar.predict.profiles import hardware, solve
from jaxpar.predict.profiles.calibration_runs import run_config
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
class Kernel:
    """One timed kernel, as opclass reads it, and its measured seconds."""

    name: str  # e.g. "3x3 s1 56x56x64->64 n16 forward"
    matmul: opclass.Matmul
    seconds: float


def load(path: str | Path) -> list[dict[str, float]]:
    """The table's rows ({column: number}); '#' lines are comments."""
    full = Path(path) if Path(path).is_absolute() else Path(configfile.ROOT, path)
    if not full.is_file():
        raise ConfigError(f"no kernel benchmark table {str(path)!r}")
    with full.open() as f:
        reader = csv.DictReader(line for line in f if not line.startswith("#"))
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ConfigError(f"kernel benchmark table {str(path)!r} has no column {missing[0]!r}")
        try:
            return [{c: float(row[c]) for c in _COLUMNS} for row in reader]
        except (TypeError, ValueError) as e:
            raise ConfigError(f"kernel benchmark table {str(path)!r}: {e}") from None


def kernels(row: dict[str, float], bytes_per_element: int = 4) -> list[Kernel]:
    """A convolution's three training kernels as opclass reads them in a compiled step.

    FLOPs 2 x N x P x Q x K x C x R x S for each (the input gradient of a strided convolution
    skips its dilation's zeros: the same count). Winograd: a 3x3 or 5x5 stride-1 window, for
    all three (the input gradient is a stride-1 convolution of that window, the filter
    gradient's result has that window's shape). GEMM views: forward M = N x P x Q, N = K,
    K = C x R x S; input gradient M = N x H x W, N = C, K = K x R x S; filter gradient M = K,
    N = C x R x S, K = N x P x Q."""
    w, h, c, n, k, r, s = (int(row[x]) for x in ("W", "H", "C", "N", "K", "R", "S"))
    p = (h + 2 * int(row["pad_h"]) - r) // int(row["stride_h"]) + 1
    q = (w + 2 * int(row["pad_w"]) - s) // int(row["stride_w"]) + 1
    if c < opclass.THIN or p <= 0 or q <= 0:
        return []
    flops = 2.0 * n * p * q * k * c * r * s
    stride1 = int(row["stride_h"]) == int(row["stride_w"]) == 1
    winograd = stride1 and r == s and str(r) in matrix.WINOGRAD
    x_bytes, y_bytes, w_bytes = (
        bytes_per_element * v for v in (n * h * w * c, n * p * q * k, k * c * r * s)
    )
    moved = float(x_bytes + y_bytes + w_bytes)
    label = f"{r}x{s} s{int(row['stride_h'])} {w}x{h}x{c}->{k} n{n}"
    views = (
        ("forward", "forward_ms", (n * p * q, k, c * r * s)),
        ("input gradient", "input_grad_ms", (n * h * w, c, k * r * s)),
        ("filter gradient", "filter_grad_ms", (k, c * r * s, n * p * q)),
    )
    tile = min(n * p * q, c, k)  # each tap's features through the tiles (Matmul.tile)
    return [
        Kernel(
            f"{label} {kind}",
            opclass.Matmul(flops, moved, winograd, min(dims), tile=tile),
            row[column] * 1e-3,
        )
        for kind, column, dims in views
        if row[column] > 0
    ]


def measured(rows: list[dict[str, float]]) -> dict[tuple, tuple]:
    """Every timed kernel of the table by its layer and view less the batch, as
    opclass.conv_keys names a convolution of a compiled step without its first element: {(H,
    W, C, K, R, S, stride_h, stride_w, P, Q, kind): ((N, seconds, Matmul as kernels() reads
    it), ...)}. A profile prices a step's kernel of a batch timed here at its measured time,
    and of another batch at the nearest timed batch's time scaled by its own price over that
    kernel's (pricing.device_time). Thin first layers are left out, as kernels() leaves them."""
    out: dict[tuple, list] = {}
    for row in rows:
        w, h, c, n, k, r, s = (int(row[x]) for x in ("W", "H", "C", "N", "K", "R", "S"))
        sh, sw = int(row["stride_h"]), int(row["stride_w"])
        p = (h + 2 * int(row["pad_h"]) - r) // sh + 1
        q = (w + 2 * int(row["pad_w"]) - s) // sw + 1
        for kernel in kernels(row):
            kind = next(x for x in opclass.KINDS if kernel.name.endswith(x))
            out.setdefault((h, w, c, k, r, s, sh, sw, p, q, kind), []).append(
                (n, kernel.seconds, kernel.matmul)
            )
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
    rows: list[dict[str, float]],
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


def model_rows(run: dict[str, Any]) -> list[tuple[dict[str, float], int]]:
    """Every 2-D convolution of a calibration run's model (model_runs.parse_row's dict) as a row of
    this table's format (its `N` the run's batch), with how many layers of the model have that
    shape, in the order the forward first meets them: read from the forward's jaxpr, so any
    model of jaxpar's registry or a builder of one's own. Grouped or dilated convolutions,
    which the table cannot hold, are left out."""

    config = run_config(run)
    model = models.build(config.model, tuple(run["image_shape"]), int(run["num_classes"]))
    variables = jax.eval_shape(model.init, jax.random.key(0))
    x = jax.ShapeDtypeStruct((int(run["batch_size"]), *run["image_shape"]), "float32")
    jaxpr = jax.make_jaxpr(
        lambda v, x: model.apply(v["params"], v["batch_stats"], x, train=True)[0]
    )(variables, x)
    counts: dict[tuple, int] = collections.Counter()
    for eqn in _equations(jaxpr.jaxpr):
        if eqn.primitive.name == "conv_general_dilated" and (key := _row_key(eqn)):
            counts[key] += 1
    return [(dict(zip(_COLUMNS[:11], key)), n) for key, n in counts.items()]


def _equations(jaxpr):
    """Every equation of a jaxpr and of the jaxprs inside it (jit, remat, custom rules)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for inner in value if isinstance(value, list | tuple) else (value,):
                inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's jaxpr
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


def _row_key(eqn) -> tuple | None:
    """A 2-D convolution equation as (W, H, C, N, K, R, S, pad_h, pad_w, stride_h, stride_w),
    an uneven padding (SAME on an even window) read as its smaller side; None for a grouped
    or dilated one, or one of other than two spatial dimensions."""
    p = eqn.params
    if (
        p["feature_group_count"] != 1
        or p["batch_group_count"] != 1
        or len(p["padding"]) != 2
        or any(d != 1 for d in (*(p["lhs_dilation"] or ()), *(p["rhs_dilation"] or ())))
    ):
        return None
    lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
    dims = p["dimension_numbers"]  # (batch, feature, spatial...), (out, in, spatial...)
    n, c = lhs[dims.lhs_spec[0]], lhs[dims.lhs_spec[1]]
    h, w = (lhs[d] for d in dims.lhs_spec[2:])
    k = rhs[dims.rhs_spec[0]]
    r, s = (rhs[d] for d in dims.rhs_spec[2:])
    (ph, pw), (sh, sw) = (min(pad) for pad in p["padding"]), p["window_strides"]
    return (w, h, c, n, k, r, s, ph, pw, sh, sw)


def vision_rows(rows: list[dict[str, float]], limit: int = 24) -> list[dict[str, float]]:
    """The table's image layers worth timing on a device of one's own: square inputs of at
    least THIN channels and a batch of at least 8, the first `limit` of them (a GPU compiles
    three programs a shape)."""
    picked = [r for r in rows if r["W"] == r["H"] and r["C"] >= opclass.THIN and r["N"] >= 8]
    return picked[:limit]


def write(path: str | Path, rows: list[dict[str, float]], header: str) -> None:
    """A kernel table in load()'s format: `header` as comment lines, then the rows."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines.append(",".join(_COLUMNS))
    for r in rows:
        lines.append(
            ",".join(
                str(int(r[c])) if i < 11 else f"{float(r[c]):.4g}" for i, c in enumerate(_COLUMNS)
            )
        )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
