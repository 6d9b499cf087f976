"""What a step costs, read from the placed state and the compiled programs: memory per device,
collectives per device per step (kind, mesh axis, bytes), bytes between pipeline stages, and
the pipeline bubble (analytic, and from measured stage times).

Kept apart from the modules that execute steps: strategies run, this module looks at them.
`report` returns the same keys for every strategy (None where a figure does not apply); it is
what `Strategy.report`, the trainer's summary, `--explain` and `python -m jaxpar.bench` read.
Bytes and memory are exact and machine-independent; stage times are this machine's.
"""

from __future__ import annotations

import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpar import axes as axes_lib
from jaxpar import hlo
from jaxpar.parallel import schedules
from jaxpar.parallel.strategy import per_device_bytes

_IOTA = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")


def parse_groups(text: str) -> list[list[int]]:
    """Replica groups as lists of device indices, from either HLO form:
    explicit `{{0,4},{1,5}}` or iota `[2,4]<=[8]` / `[4,2]<=[2,4]T(1,0)`."""
    if text.startswith("mesh["):  # mesh['axis_0'=2,'axis_1'=4] {'axis_1'}: groups vary along
        sizes = [(n, int(v)) for n, v in re.findall(r"'(\w+)'=(\d+)", text.split("]")[0])]
        chosen = re.findall(r"'(\w+)'", text.split("]", 1)[1])
        ids = np.arange(int(np.prod([v for _, v in sizes]))).reshape([v for _, v in sizes])
        order = [i for i, (n, _) in enumerate(sizes) if n not in chosen] + [
            i for i, (n, _) in enumerate(sizes) if n in chosen
        ]
        size = int(np.prod([v for n, v in sizes if n in chosen]))
        return ids.transpose(order).reshape(-1, size).tolist()
    match = _IOTA.fullmatch(text.strip())
    if match:
        shape = [int(x) for x in match.group(1).split(",")]
        dims = [int(x) for x in match.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if match.group(3):
            ids = ids.transpose([int(x) for x in match.group(3).split(",")])
        return ids.reshape(shape[0], -1).tolist()
    return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", text)]


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
    every = "+".join(n for n, size in mesh_shape.items() if size > 1) or "none"
    branch = hlo.branch_lines(text)
    out = []
    for i, line in enumerate(text.splitlines()):
        for c in hlo.collectives(line):
            # no groups printed (`replica_groups={}`): one group of every device
            groups = parse_groups(c.groups) if c.groups else []
            axes = mesh_axes_of(groups, mesh_shape) if any(groups) else every
            out.append((c.kind, axes, i in branch, c.bytes))
    return out


def collective_rows(text: str, mesh_shape: dict[str, int], times: int = 1) -> dict:
    """{(kind, axes): [count, bytes]} per call of a program run `times` times a step,
    collectives in conditional branches counted as if taken."""
    rows: dict[tuple[str, str], list[int]] = {}
    for kind, axes, _, nbytes in _placed(text, mesh_shape):
        entry = rows.setdefault((kind, axes), [0, 0])
        entry[0] += times
        entry[1] += times * nbytes
    return rows


def program_group(program) -> str:
    """A program's group in the tables: "step" for a whole-step program, else its stage."""
    return "step" if program.name == "step" else f"stage {program.stage}"


def programs(strategy, batch_size: int) -> list:
    """The strategy's programs of one train step on a global batch of `batch_size`."""
    return strategy.programs(strategy.batch_shapes(batch_size))


def program_flops(compiled) -> float:
    """FLOPs of one call of a compiled program, per device (XLA's cost analysis)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", 0.0))


def step_flops(strategy, batch_size: int) -> float:
    """FLOPs of one train step over all devices' programs, from XLA's cost analysis of the
    compiled programs (per device, times the devices of each program's mesh)."""
    return sum(p.times * program_flops(p.compiled) * p.num_devices
               for p in programs(strategy, batch_size))  # fmt: skip


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


def _materialize(args):
    """Zeros shaped and placed like abstract arguments."""
    return jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype, device=a.sharding), args)


def time_program(program, repeats: int = 3) -> float:
    """Smallest wall time of one call of a compiled program over `repeats` runs after a
    warm-up, device synchronised; fresh arguments each call (some are donated)."""
    times = []
    for i in range(repeats + 1):
        args = jax.block_until_ready(_materialize(program.args))
        t0 = time.perf_counter()
        jax.block_until_ready(program.compiled(*args))
        if i:
            times.append(time.perf_counter() - t0)
    return min(times)


def measure_pipeline(strategy, batch_size: int, repeats: int = 3) -> dict[str, Any]:
    """Time each chunk's forward, backward (B) and weight-gradient (W, zero-bubble schedules)
    programs alone, then place the schedule's events on a clock with those durations.

    Returns per-chunk seconds per micro-batch, the bubble of that timeline, and the analytic
    bubble. On hardware where stages have their own processors this timeline is what the
    dispatcher achieves; on simulated CPU devices sharing cores, wall time is longer because
    stages also compete for the cores.
    """
    events = strategy.schedule_events()
    n = schedules.num_chunks(events)
    clocks = {"forward": [0.0] * n, "backward": [0.0] * n, "backward input": [0.0] * n,
              "backward weights": [0.0] * n}  # fmt: skip
    for p in programs(strategy, batch_size):
        if p.role in clocks:
            clocks[p.role][p.chunk] = time_program(p, repeats)
    bwd = [b + i for b, i in zip(clocks["backward"], clocks["backward input"])]
    line = schedules.timeline(events, clocks["forward"], bwd, clocks["backward weights"])
    return {
        "stage_forward_s": clocks["forward"],
        "stage_backward_s": bwd,
        "stage_weight_grad_s": clocks["backward weights"],
        "measured_bubble": line.bubble,
        "stage_time_s": [
            f + b + w for f, b, w in zip(clocks["forward"], bwd, clocks["backward weights"])
        ],
        "timeline_step_s": line.makespan,
        "sequential_step_s": sum(line.busy),
        "analytic_bubble": strategy.analytic_bubble(),
    }


def collective_summary(rows: list[list], data_size: int, replica_axes: str = "data"
                       ) -> dict[str, Any]:  # fmt: skip
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
    halo = sum(r[4] for r in crossing if r[0] == busiest and r[1] == "collective-permute"
               and set(r[2].split("+")) & ruled)  # fmt: skip
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


def _temp_bytes(compiled) -> int:
    return int(compiled.memory_analysis().temp_size_in_bytes)


def stage_memory(strategy, batch_size: int, progs) -> tuple[list[int], list[int], list[int]]:
    """Per device stage, one device's bytes of placed state (abstract), of its programs'
    largest temporaries, and of stored activations at the schedule's peak."""
    k = strategy.num_stages
    state = [per_device_bytes(pairs) for pairs in strategy.stage_states(strategy.state_shapes())]
    temp = [max((_temp_bytes(p.compiled) for p in progs if p.stage == s), default=0)
            for s in range(k)]  # fmt: skip
    stash = strategy.stored_activation_bytes(batch_size) or [0] * k
    return state, temp, stash


def stage_transfer_bytes(strategy, batch_size: int, progs) -> int:
    """The most stage-to-stage bytes any one device receives per step: each device of a chunk
    gets its share (the batch split over the batch axes, as the pipeline places it) of the
    activations from the chunk before and of the gradients from the chunk after, every
    micro-batch, unless that chunk is on its own stage. Per device, like the collectives: the
    stage-transfer part of the communication per device (memory_vs_bytes.png)."""
    sent = strategy.sent_bytes_per_device(batch_size)  # per chunk, per micro-batch, per device
    stage_of = {p.chunk: p.stage for p in progs}
    received: dict[int, int] = {}
    for c, d in stage_of.items():
        here = (sent[c - 1] if c > 0 and stage_of.get(c - 1) != d else 0) + (
            sent[c] if c + 1 in stage_of and stage_of[c + 1] != d else 0
        )
        received[d] = received.get(d, 0) + strategy.num_microbatches * here
    return max(received.values(), default=0)


def report(strategy, batch_size: int, timing: bool = True) -> dict[str, Any]:
    """Every figure of one step, with the same keys for every strategy (None: not applicable),
    read from the strategy's abstract state and its compiled programs only, so that any
    process of a multi-process run gives the whole report.

    Memory per device = placed state + compiled temporaries + stored stage inputs (pipelines),
    for the busiest device. Collective bytes per device: the busiest program group (the
    whole step, or the busiest pipeline stage); the by-kind and by-axis breakdowns are that
    group's, over collectives that cross devices (groups of one device move nothing).
    `timing` adds the measured bubble (pipelines, run in one process).
    """
    progs = programs(strategy, batch_size)
    rows = collectives(progs, strategy.conditional_period())
    k, pipe = strategy.num_stages, strategy.schedule is not None
    per_stage = strategy.stage_states(strategy.state_shapes())
    params = [per_device_bytes([st.params for st, _ in pairs]) for pairs in per_stage]
    opt = [per_device_bytes([st.opt_state for st, _ in pairs]) for pairs in per_stage]
    state_b, temp, stash = stage_memory(strategy, batch_size, progs)
    memory = [a + b + c for a, b, c in zip(state_b, temp, stash)]
    shape = dict(strategy.mesh.shape)
    data_size = axes_lib.num_replicas(shape)
    between = strategy.bytes_between_stages(batch_size)
    out: dict[str, Any] = {
        "param_bytes": int(strategy.model.num_params * 4),
        "param_bytes_per_device": max(params),
        "opt_state_bytes_per_device": max(opt),
        "state_bytes_per_device": max(state_b),
        "program_temp_bytes_per_device": max(temp),
        "stored_activation_bytes_per_device": max(stash) if pipe else None,
        "memory_bytes_per_device": max(memory),
        "memory_per_device_bytes": memory,  # per stage for pipelines, one entry otherwise
        **collective_summary(
            per_step_rows(rows), data_size, "+".join(axes_lib.replica_axes(shape)) or "data"
        ),
        "num_stages": k,
        "pipeline_schedule": strategy.schedule,
        "num_microbatches": strategy.num_microbatches if pipe else None,
        "stage_bounds": list(strategy.bounds) if pipe else None,
        "analytic_bubble": strategy.analytic_bubble(),
        "analytic_bubble_formula": (schedules.bubble_formula(strategy.schedule) if pipe else None),
        "measured_bubble": None,
        # Per chunk, seconds per micro-batch (F + B + W): predicted from the layers' measured
        # times where the split was by time, measured by timing the chunk programs.
        "stage_time_predicted_s": (
            strategy.model.times.chunk_times(strategy.bounds)
            if pipe and strategy.model.times is not None
            else None
        ),
        "stage_time_measured_s": None,
        # the stage-to-stage bytes / step (activations forward + gradients back, whole
        # global batch), and the most any one device receives of them per step
        "bytes_between_stages_per_step": between,
        "stage_transfer_bytes_per_device": stage_transfer_bytes(strategy, batch_size, progs)
        if pipe
        else None,
        "peak_stash_bytes_per_device": stash if pipe else None,
        "stage_state_bytes_per_device": state_b if pipe else None,
        "stage_program_temp_bytes": temp if pipe else None,
    }
    if pipe and timing:
        line = measure_pipeline(strategy, batch_size)
        out["measured_bubble"] = line["measured_bubble"]
        out["stage_time_measured_s"] = line["stage_time_s"]
    return out
