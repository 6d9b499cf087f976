"""Predict each partitioning's step time, images/sec, speedup, efficiency and memory fit on
hardware you do not have, from what jaxpar knows exactly (per-layer FLOPs, the compiled
programs' collectives and memory, the pipeline schedule) and a hardware profile.

    from jaxpar.predict import load_profile, predict_config, predict_rows, recommend
    profile = load_profile("configs/hardware/dgx1_p100.py")
    rows = predict_rows([("data 8", config8), ("1 device", config1)], profile)

CLI: `python -m jaxpar.predict --profile configs/hardware/dgx1_p100.py --suite FILE`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from jaxpar import oneline, units
from jaxpar.predict.profiles import hardware
from jaxpar.predict.profiles.fitting import load_profile
from jaxpar.predict.profiles.hardware import Profile
from jaxpar.predict.programs import gputarget
from jaxpar.predict.programs.workload import Workload, describe, resolve_mesh, workload
from jaxpar.predict.records import PredictedRow, Reference, Scaling
from jaxpar.predict.step.model import predict_workload

__all__ = [
    "PredictedRow",
    "Profile",
    "Reference",
    "Scaling",
    "Workload",
    "load_profile",
    "predict_config",
    "predict_rows",
    "predict_workload",
    "recommend",
    "with_references",
    "workload",
]


def predict_config(config, profile: Profile, overlap: float | None = None) -> PredictedRow:
    """One row: predicted times, images/sec, memory per device and fit for `config`."""
    if overlap is not None:
        profile = hardware.replace(profile, overlap=float(overlap))
    shape = resolve_mesh(config, profile.device.num_devices)
    n = math.prod(shape.values())
    if n > profile.device.num_devices:  # refuse before compiling anything
        return PredictedRow(
            status="failed",
            mesh_shape=tuple(shape.values()),
            mesh_axes=tuple(shape),
            num_devices=n,
            fits=False,
            error=f"needs {n} devices, profile {profile.name} has {profile.device.num_devices}",
        )
    w = workload(config, profile.device.num_devices, gputarget.of(profile))
    return dataclasses.replace(
        predict_workload(w, profile), collective_bytes_per_device=describe(w)
    )


def predict_rows(
    configs: Sequence[Any],
    profile: Profile,
    overlap: float | None = None,
    predict=None,
    say: Callable[[str], None] | None = None,
) -> list[PredictedRow]:
    """Predict every config (or (name, config) pair); add speedup and efficiency against the
    1-device row of the same model (the first such row; a 1-device row against itself), as
    images/sec ratios. `predict(config, profile, overlap)` in place of predict_config (a
    cache of it: --validate predicts the same rows for several published tables); `say`
    takes one progress line per row (each compiles its programs: seconds to minutes)."""
    rows, t0 = [], time.perf_counter()
    for i, item in enumerate(configs):
        name, config = item if isinstance(item, tuple) else (f"row {i}", item)
        t = time.perf_counter()
        try:
            row = (predict or predict_config)(config, profile, overlap)
        except ValueError as e:  # ConfigError and friends: a refused row, reported
            row = PredictedRow(status="failed", error=oneline.first_line(e), fits=False)
        rows.append(dataclasses.replace(row, name=name))
        if say is not None:
            say(
                progress_line(
                    i + 1,
                    len(configs),
                    name,
                    row,
                    time.perf_counter() - t,
                    time.perf_counter() - t0,
                )
            )
    bases: dict = {}
    for r in rows:
        if r.num_devices == 1 and r.ok:
            bases.setdefault(r.model, r)
    return [dataclasses.replace(r, scaling=_scaling(r, bases)) for r in rows]


def _scaling(row: PredictedRow, bases: dict) -> Scaling:
    """`row` against the 1-device row of its model (a 1-device row is its own baseline: rows
    of other batches or dtypes)."""
    base = row if row.num_devices == 1 else bases.get(row.model)
    if base is None or not row.ok:
        return Scaling(None, None)
    speedup = row.images_per_sec / base.images_per_sec
    return Scaling(speedup, speedup / row.num_devices)


def with_references(rows: Sequence[PredictedRow], references: Sequence) -> list[PredictedRow]:
    """Beside each prediction, its suite's reference (jaxpar.suites.Reference, or None): the
    published or measured images/sec and its efficiency against the reference 1-device row of
    the same model; or a published efficiency alone."""
    bases = {}
    for r, ref in zip(rows, references):
        if ref is not None and ref.images_per_sec is not None and r.num_devices == 1:
            bases.setdefault(r.model, ref.images_per_sec)
    out = []
    for r, ref in zip(rows, references):
        if ref is not None and ref.images_per_sec is None:
            out.append(dataclasses.replace(r, reference=Reference(None, ref.efficiency)))
            continue
        rate = ref.images_per_sec if ref is not None else None
        base = rate if r.num_devices == 1 else bases.get(r.model)
        eff = rate / base / r.num_devices if rate and base and r.num_devices else None
        out.append(dataclasses.replace(r, reference=Reference(rate, eff)))
    return out + list(rows[len(out) :])


def progress_line(
    done: int, total: int, name: str, row: PredictedRow, took: float, elapsed: float
) -> str:
    """One row done: "predicted 3/32 tensor 8: 355.1 img/s (4.2 s); elapsed 00:13, ETA 01:30"."""
    what = f"{row.images_per_sec:,.1f} img/s" if row.ok else f"refused: {row.error}"
    eta = elapsed / done * (total - done)
    return (
        f"predicted {done}/{total} {name}: {what} ({took:.1f} s); elapsed "
        f"{units.clock(elapsed)}, ETA {units.clock(eta)}"
    )


def recommend(rows: Sequence[PredictedRow]) -> str:
    """The fastest partitioning that fits, and why, in the seeds' terms: memory fit, bytes per
    step against compute per step, bubble."""
    ok = [r for r in rows if r.ok]
    fitting = sorted((r for r in ok if r.fits), key=lambda r: -r.images_per_sec)
    if not ok:
        return "recommendation: none: no row could be predicted on this profile (errors above)"
    if not fitting:
        need = _gib(min(r.memory_bytes_per_device for r in ok))
        return f"recommendation: none: nothing fits in device memory; the smallest needs {need}"
    best = fitting[0]
    why = [
        f"{best.images_per_sec:,.0f} img/s",
        f"memory {_gib(best.memory_bytes_per_device)} of {_gib(best.memory_capacity_bytes)}",
        (
            f"compute {best.compute_s * 1e3:.1f} ms against exposed communication "
            f"{best.comm_s * 1e3:.1f} ms per step"
        ),
    ]
    if best.schedule:
        why.append(f"bubble {best.bubble_s * 1e3:.1f} ms")
    faster = [r for r in ok if not r.fits and r.images_per_sec > best.images_per_sec]
    tail = ""
    if faster:
        top = max(faster, key=lambda r: r.images_per_sec)
        tail = (
            f"; {top.name} would be faster ({top.images_per_sec:,.0f} img/s) but needs "
            f"{_gib(top.memory_bytes_per_device)} per device"
        )
    if len(fitting) > 1:
        second = fitting[1]
        tail += (
            f"; next: {second.name} ({second.images_per_sec:,.0f} img/s, "
            f"comm {second.comm_s * 1e3:.1f} ms, bubble {second.bubble_s * 1e3:.1f} ms)"
        )
    return f"recommendation: {best.name}: " + ", ".join(why) + tail


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
