"""A profiler trace of a compiled program joined with the program's text, kernel by kernel:
each kernel's device time beside its instruction's FLOPs, bytes and class (what
benchmarks/gpu_trace.py prints, and what `--calibrate-here` on a GPU fits the memory-bound
kernels' costs from: `memory_costs`).

A GPU's trace names, in each kernel event's `hlo_op`, the instruction it runs (with XLA's
command buffers off: `--xla_gpu_enable_command_buffer=`; on, only fusions carry names). A CPU's
trace names its events (thunks) after the top-level instructions, so it joins the same way.
"""

from __future__ import annotations

import collections
import csv
import glob
import gzip
import json
import math
import os
from typing import Any, NamedTuple

import numpy as np

from jaxpar import hlo
from jaxpar.errors import ConfigError
from jaxpar.predict.kernels import library, opclass


class TraceEvent(NamedTuple):
    """What the join takes of one event of a profiler trace (Chrome's trace format)."""

    ph: str | None  # the phase: "X" a span, "M" metadata
    pid: int | None
    name: str
    dur: float  # microseconds (a span's)
    process: str | None  # a metadata event's args.name: the process it names
    hlo_op: str  # a GPU kernel's instruction ("?" where it names none)

    @classmethod
    def of_record(cls, event: dict[str, Any]) -> TraceEvent:
        args = event.get("args", {})
        return cls(
            event.get("ph"),
            event.get("pid"),
            event.get("name", ""),
            event.get("dur", 0.0),
            str(args.get("name")),
            args.get("hlo_op", "?"),
        )


class Trace(NamedTuple):
    """A profiler trace file's events."""

    events: list[TraceEvent]

    @classmethod
    def of_record(cls, trace: dict[str, Any]) -> Trace:
        return cls([TraceEvent.of_record(e) for e in trace["traceEvents"]])


def kernel_times(trace_dir: str, top: set[str] = frozenset()) -> tuple[dict[str, float], int, str]:
    """Seconds per step of each HLO instruction's kernels (mean of the trace's steps), and
    the device: a GPU's kernels name their instruction in `hlo_op`; without GPU events, the
    CPU's are the events named after one of the `top` (top-level) instructions."""
    found = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not found:
        raise ConfigError(f"no *.trace.json.gz under {trace_dir}")
    events = Trace.of_record(json.load(gzip.open(found[0]))).events
    gpu = {e.pid for e in events if e.ph == "M" and "GPU" in e.process}
    if gpu:
        spans = [(e.hlo_op, e.dur) for e in events if e.ph == "X" and e.pid in gpu]
    else:
        spans = [(e.name, e.dur) for e in events if e.ph == "X" and e.name in top]
    per: dict[str, float] = collections.defaultdict(float)
    for name, micros in spans:
        per[name] += micros * 1e-6
    counts = collections.Counter(name for name, _ in spans).values()
    steps = 2 if counts and all(v % 2 == 0 for v in counts) else 1  # single_device.py traces two
    return {k: v / steps for k, v in per.items()}, steps, "gpu" if gpu else "cpu"


def _entry(name: str, program: hlo.Program) -> hlo.Instruction:
    """The entry computation's instruction `name` (its last, where printed twice)."""
    return {i.name: i for i in program.entry}[name]


def cpu_matrix_flops(name: str, program: hlo.Program) -> tuple[float, bool]:
    """(FLOPs, thin) of a CPU program's top-level instruction: a convolution or dot, or a
    fusion holding them; (0, False) else."""
    kernels = opclass.matmuls_of(_entry(name, program), program)
    return sum((m.flops for m in kernels), 0.0), any(m.thin for m in kernels)


def kernel_class(name: str, program: hlo.Program) -> str:
    """A memory-bound top-level kernel's class (opclass.memory_class, as opclass.classify names
    it in the program it prices)."""
    return opclass.memory_class(_entry(name, program), program)[0]


def largest_reduction(name: str, program: hlo.Program) -> tuple[int, int, int, bool]:
    """opclass.largest_reduction of the top-level instruction `name`."""
    return opclass.largest_reduction(_entry(name, program), program)


def fit_line(b: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Least squares of t = fixed + b / bandwidth with both non-negative: (fixed, bandwidth)."""
    fixed, per_byte = np.linalg.lstsq(np.vstack([np.ones_like(b), b]).T, t, rcond=None)[0]
    if fixed < 0:
        fixed, per_byte = 0.0, float(t.sum() / b.sum())
    elif per_byte <= 0:
        fixed, per_byte = float(t.mean()), 0.0
    return float(fixed), 1 / per_byte if per_byte > 0 else math.inf


class JoinedKernel(NamedTuple):
    """One traced instruction's kernels beside what the program says of it."""

    name: str
    flops: float
    thin: bool
    bytes: float
    seconds: float  # per step
    kind: str  # its class
    tile: int  # a GPU matrix kernel's fewest rows or features, else 0
    results: int  # a reduce_few kernel's, else 1

    @classmethod
    def of_record(cls, line: dict[str, str]) -> JoinedKernel:
        """A kernel from a line of write_csv's table."""
        return cls(
            line["name"],
            float(line["flops"]),
            bool(int(line["thin"])),
            float(line["bytes"]),
            float(line["seconds"]),
            line["class"],
            int(line["tile"]),
            int(line["results"]),
        )


class Joined(NamedTuple):
    """A row's program joined with its trace."""

    kernels: list[JoinedKernel]
    total_s: float  # the kernels' total seconds per step
    steps: int  # the steps traced
    device: str


def joined(trace_dir: str, hlo_path: str) -> Joined:
    """Each traced instruction of one row's program, as a JoinedKernel."""
    with gzip.open(hlo_path, "rt") if hlo_path.endswith(".gz") else open(hlo_path) as f:
        text = f.read()
    program = hlo.parse(text)
    types = program.types
    times, steps, device = kernel_times(trace_dir, {i.name for i in program.entry})
    rows = []
    for name, seconds in times.items():
        if name not in program.by_name:
            continue
        ins = program.by_name[name]
        tile = 0
        if device == "cpu":
            flops, thin = cpu_matrix_flops(name, program)
        else:  # a cuDNN or cuBLAS call, read as the predictor reads it
            call = library.library_matmul(ins, types) if ins.opcode == "custom-call" else None
            flops, thin, tile = (call.flops, call.thin, call.tile) if call else (0.0, False, 0)
        moved = hlo.shape_bytes(ins.type.split("u8[")[0]) + sum(
            hlo.shape_bytes(types[a]) for a in set(ins.operands) if a in types
        )
        kind = kernel_class(name, program)
        if device == "cpu" and not flops:  # as opclass.classify names and counts them
            kind = opclass.cpu_class(kind, ins, types)
            moved = opclass.kernel_bytes(ins, types, kind)
        results = largest_reduction(name, program)[1] if kind == "reduce_few" else 1
        rows.append(JoinedKernel(name, flops, thin, float(moved), seconds, kind, tile, results))
    return Joined(rows, sum(times.values()), steps, device)


COLUMNS = (
    "program",
    "device",
    "name",
    "flops",
    "thin",
    "bytes",
    "seconds",
    "class",
    "tile",
    "results",
)


def write_csv(path: str, programs: list[tuple[str, str, list[tuple]]]) -> None:
    """Every joined kernel of each (program, device, rows) as one line of a CSV (gzip where the
    path ends .gz): the figures a profile's costs are fitted from, small enough to keep beside
    the profile where the traces themselves (hundreds of MB) are not."""

    with gzip.open(path, "wt") if path.endswith(".gz") else open(path, "w") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        for program, device, rows in programs:
            for r in rows:
                out.writerow(
                    [
                        program,
                        device,
                        r[0],
                        f"{r[1]:.6g}",
                        int(bool(r[2])),
                        f"{r[3]:.6g}",
                        f"{r[4]:.6g}",
                        r[5],
                        r[6],
                        r[7],
                    ]
                )


class CsvKernel(NamedTuple):
    """A line of write_csv's table: a kernel and the program and device it ran in."""

    program: str
    device: str
    kernel: JoinedKernel

    @classmethod
    def of_record(cls, line: dict[str, str]) -> CsvKernel:
        return cls(line["program"], line["device"], JoinedKernel.of_record(line))


def read_csv(path: str) -> list[tuple[str, str, list[JoinedKernel]]]:
    """write_csv's programs back: [(program, device, rows as joined() gives them)]."""

    programs: dict[tuple[str, str], list[JoinedKernel]] = {}
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        for line in map(CsvKernel.of_record, csv.DictReader(f)):
            programs.setdefault((line.program, line.device), []).append(line.kernel)
    return [(p, d, rows) for (p, d), rows in programs.items()]


class ClassFigures(NamedTuple):
    """A memory-bound class's kernels in the traces and their totals."""

    kernels: int
    seconds: float
    bytes: float


class MemoryCosts(NamedTuple):
    """The memory-bound kernels' costs as a profile takes them."""

    all: tuple[float, float] | None  # (fixed s, bytes/s) over them all; None without any
    classes: dict[str, tuple[float, float]]  # each class's (memory_kernel_costs)
    figures: dict[str, ClassFigures]


def memory_costs(rows: list[JoinedKernel]) -> MemoryCosts:
    """The memory-bound kernels of joined rows (of one or more programs) fitted as a profile
    takes them: time = fixed + bytes / bandwidth over all of them (`all`: a profile's kernel_s
    and memory_bandwidth) and for each class of opclass.MEMORY_CLASSES with two or more kernels
    (`classes`: its memory_kernel_costs; reduce_few on bytes per result, one lane's rate), with
    each class's kernels, seconds and bytes (`figures`)."""
    mem = [r for r in rows if not r.flops]
    if not mem:
        return MemoryCosts(None, {}, {})
    b, t = np.array([r.bytes for r in mem]), np.array([r.seconds for r in mem])
    classes, figures = {}, {}
    kinds = np.array([r.kind for r in mem])
    lane = b / np.array([max(r.results, 1) for r in mem])
    for name in opclass.MEMORY_CLASSES:
        m = kinds == name
        figures[name] = ClassFigures(int(m.sum()), float(t[m].sum()), float(b[m].sum()))
        if m.sum() >= 2:
            fixed, bandwidth = fit_line(lane[m] if name == "reduce_few" else b[m], t[m])
            if math.isfinite(bandwidth):
                classes[name] = (fixed, bandwidth)
    return MemoryCosts(fit_line(b, t), classes, figures)
