"""The collectives of compiled programs placed on the mesh: which axes each runs over (from its
replica groups), counted per program and per step, and their totals per device.

`jaxpar.hlo` reads the collectives of one HLO text; this module places them on a run's mesh;
`analysis.report` puts the totals beside memory and timing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxpar import axes as axes_lib
from jaxpar import hlo


def mesh_axes_of(groups: list[list[int]], mesh_shape: dict[str, int]) -> str:
    """Which mesh axes a collective runs over: those whose coordinate varies in a group."""
    names, sizes = list(mesh_shape), list(mesh_shape.values())
    varying: set[str] = set()
    for group in groups:
        coords = np.array([np.unravel_index(i, sizes) for i in group])
        varying |= {names[a] for a in range(len(names)) if len(set(coords[:, a])) > 1}
    return "+".join(n for n in names if n in varying) or "none"


def _placed(text: str, mesh_shape: dict[str, int]) -> list[tuple[str, str, bool, int]]:
    """Every collective of a program as (kind, mesh axes, in a conditional branch, bytes
    per device per call)."""
    return [
        (c.kind, collective_axes(c, mesh_shape), c.in_branch, c.bytes)
        for c in hlo.collectives(text)
    ]


def collective_axes(c: hlo.Collective, mesh_shape: dict[str, int]) -> str:
    """The mesh axes one collective runs over, from its replica groups (none printed,
    `replica_groups={}`: one group of every device, so every axis of more than one)."""
    groups = hlo.replica_groups(c.groups) if c.groups else []
    if any(groups):
        return mesh_axes_of(groups, mesh_shape)
    return "+".join(n for n, size in mesh_shape.items() if size > 1) or "none"


def collective_rows(text: str, mesh_shape: dict[str, int], times: int = 1) -> dict:
    """{(kind, axes): [count, bytes]} per call of a program run `times` times a step,
    collectives in conditional branches counted as if taken."""
    return {
        key: [times * len(sizes), times * sum(sizes)]
        for key, sizes in collective_sizes(text, mesh_shape).items()
    }


def collective_sizes(text: str, mesh_shape: dict[str, int]) -> dict:
    """{(kind, axes): [bytes per device of each call, in program order]} of one program,
    collectives in conditional branches counted as if taken."""
    rows: dict[tuple[str, str], list[int]] = {}
    for kind, axes, _, nbytes in _placed(text, mesh_shape):
        rows.setdefault((kind, axes), []).append(nbytes)
    return rows


def program_group(program) -> str:
    """A program's group in the tables: "step" for a whole-step program, else its stage."""
    return "step" if program.name == "step" else f"stage {program.stage}"


def collectives(progs, period: int = 1) -> dict[tuple[str, str, str, int], list[int]]:
    """{(where, kind, axes, every): [count, bytes per device]} over every program, per run:
    `every` is 1 for collectives that run every step, and `period` for those in conditional
    branches (local_sgd's average runs once every sync.period steps)."""
    rows: dict = {}
    for p in progs:
        for kind, axes, branch, nbytes in _placed(p.compiled.as_text(), dict(p.mesh.shape)):
            every = period if branch and period > 1 else 1
            entry = rows.setdefault((program_group(p), kind, axes, every), [0, 0])
            entry[0] += p.times
            entry[1] += p.times * nbytes
    return rows


def per_step_rows(rows: dict) -> list[list]:
    """The report's collective rows, [where, kind, axes, count, bytes per step, every], from
    `collectives`: a collective that runs once every `every` steps shows its per-step average
    (bytes / every; `count` stays per run)."""
    out = []
    for (where, kind, axes, every), (count, nbytes) in sorted(rows.items()):
        per_step = nbytes // every if nbytes % every == 0 else nbytes / every
        out.append([where, kind, axes, count, per_step, every])
    return out


def ring_allreduce_wire_bytes(payload: int, n: int) -> float:
    """Bytes each device sends in a ring all-reduce of `payload` bytes over n devices:
    reduce-scatter then all-gather, (n-1)/n of the payload each: 2(n-1)/n x payload."""
    return 2 * (n - 1) / n * payload if n > 1 else 0.0


def collective_summary(rows: list[list], data_size: int, replica_axes: str) -> dict[str, Any]:
    """Totals from [where, kind, axes, count, bytes per step, every] rows (`per_step_rows`):
    bytes per device per step of the busiest program group (collectives that run once every
    K steps at their per-step average), its breakdown by kind and by mesh axis, and the
    all-reduce over the replica axes (`replica_axes`, "+"-joined: the gradient average)
    beside its ring wire estimate 2(N-1)/N x payload, and the halo exchanges (collective-permutes
    over a rules axis: spatial's)."""
    crossing = [r for r in rows if r[2] != "none"]
    groups: dict[str, int] = {}
    for where, _, _, _, nbytes, *_ in crossing:
        groups[where] = groups.get(where, 0) + nbytes
    busiest = max(groups, key=groups.get) if groups else None
    by_kind: dict[str, int] = {}
    by_axis: dict[str, int] = {}
    for where, kind, axes, _, nbytes, *_ in crossing:
        if where == busiest:
            by_kind[kind] = by_kind.get(kind, 0) + nbytes
            by_axis[axes] = by_axis.get(axes, 0) + nbytes
    payload = by_kind_axis(crossing, busiest, "all-reduce", replica_axes)
    ruled = {a for a in axes_lib.names() if axes_lib.get(a).role == "rules"}
    halo = sum(
        r[4]
        for r in crossing
        if r[0] == busiest and r[1] == "collective-permute" and set(r[2].split("+")) & ruled
    )
    return {
        "collectives": rows,
        "collective_bytes_per_device": groups[busiest] if busiest else 0,
        "collective_bytes_by_kind": by_kind,
        "collective_bytes_by_axis": by_axis,
        "data_allreduce_bytes": payload,
        # neighbour exchanges over a rules axis: spatial's halos (XLA's partitioner)
        "halo_bytes_per_device": halo,
        "ring_allreduce_wire_bytes": ring_allreduce_wire_bytes(payload, data_size),
    }


def by_kind_axis(rows: list[list], where: str | None, kind: str, axes: str) -> int:
    """Bytes of collectives of `kind` over exactly mesh axes `axes` in program group `where`."""
    return sum(r[4] for r in rows if r[0] == where and r[1] == kind and r[2] == axes)
