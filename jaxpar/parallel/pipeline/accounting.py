"""What a pipeline step runs and moves, read off a built `Pipeline` (its protocol methods call
these): the programs a step runs, the bytes across each stage boundary, each stage's stored
activations at the schedule's peak, and the stage table with the schedule drawn per stage."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxpar.parallel import schedules, stages
from jaxpar.parallel.pipeline import shapes
from jaxpar.parallel.strategy import Program, per_device_bytes

ROLES = {
    "fwd": "forward",
    "fwd_res": "forward",
    "bwd": "backward",
    "bwd_res": "backward",
    "bwd_in": "backward input",
    "bwd_w": "backward weights",
    "update": "update",
    "combine": "update",
    "apply_update": "update",
}


def programs(p, batch_shapes) -> list[Program]:
    """Every chunk's step programs, lowered for these batch shapes, with their calls a step."""
    rows = batch_shapes["image"][0].shape[0]
    out = []
    for c, ck in enumerate(p.chunks):
        names = shapes.step_programs(p.remat, p.split_backward, ck.last, ck.adapt is not None)
        args = shapes.program_args(p, c, rows, names)
        progs = p.programs_of[c].programs
        for name in names:
            times = schedules.calls_per_step(name, p.num_microbatches)
            lowered = progs[name].lower(*args[name])
            out.append(Program(name, ROLES[name], ck.stage, c, ck.mesh, times, args[name], lowered))
    return out


def boundary_bytes(p, batch_size: int) -> list[int]:
    """Per chunk, the stage-to-stage bytes per step across the boundary after it: its
    output activation forward and that activation's gradient back, for the whole global
    batch (in the dtype carried). 0 after the last chunk, and where the next chunk is on
    the same device stage (ZB-V's turn: nothing moves)."""
    out = p.boundary(batch_size)
    crosses = [c + 1 < len(out) and p.stage_of[c + 1] != p.stage_of[c] for c in range(len(out))]
    return [
        2 * int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize if cross else 0
        for x, cross in zip(out, crosses)
    ]


def sent_bytes_per_device(p, batch_size: int) -> list[int]:
    """Per chunk, one device's bytes sent forward a micro-batch (0 after the last chunk)."""
    rows = batch_size // p.num_microbatches
    out = [
        int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize // p.data for x in p.boundary(rows)[:-1]
    ]
    return [*out, 0]


def stored_activation_bytes(p, batch_size: int) -> list[int]:
    """Per device stage, one device's stored bytes at the schedule's peak: the chunk
    inputs a recomputing backward needs, or the residuals (and, zero-bubble, the output
    gradients B keeps for W), walked over the dispatch order exactly as the runner stores
    and frees them (its measured `peak_stash_bytes` equals this)."""
    rows = batch_size // p.num_microbatches
    stash, kept = [], []
    for c, ck in enumerate(p.chunks):
        names = shapes.step_programs(p.remat, p.split_backward, ck.last, ck.adapt is not None)
        args = shapes.program_args(p, c, rows, names)
        first_bwd = args["bwd"] if p.remat else args[names[1]]
        stash.append(per_device_bytes(first_bwd[1]))
        kept.append(per_device_bytes(args["bwd_w"][2]) if "bwd_w" in args else 0)
    live, peak = [0] * p.k, [0] * p.k
    for kind, c, _ in p.order:
        d = p.stage_of[c]
        change = {
            "F": stash[c],
            "B": kept[c] - (0 if p.split_backward else stash[c]),
            "W": -stash[c] - kept[c],
        }[kind]
        if kind == "B" and p.remat:
            change = -stash[c]
        live[d] += change
        peak[d] = max(peak[d], live[d])
    return peak


def describe(p, batch_size: int) -> str:
    """The stage table and the schedule, drawn per stage."""
    m = p.num_microbatches
    head = (
        f"pipeline: {p.k} stages, {p.num_chunks} chunks, split "
        f"{p.config.pipeline.split!r} {p.bounds}, schedule {p.schedule}, {m} "
        f"micro-batch{'es' if m != 1 else ''}, analytic bubble {p.analytic_bubble():.3f} "
        f"= {schedules.bubble_formula(p.schedule)}"
    )
    legend = "schedule, per stage: Fi = forward of micro-batch i, Bi = its backward"
    if p.split_backward:
        legend += " (input gradient only), Wi = its weight gradient"
    if p.num_chunks > p.k:
        legend += "; Fi.c = in chunk c (the table says which stage holds each chunk)"
    table = stages.stage_table(
        p.model, p.bounds, batch_size, p.stage_of, boundary_bytes(p, batch_size)
    )
    return "\n".join([head, table, legend + ":", schedules.render(p.events)])
