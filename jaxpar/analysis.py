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

from jaxpar import hlo
from jaxpar.parallel import schedules
from jaxpar.parallel.pipeline import Pipeline

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


def collective_rows(text: str, mesh_shape: dict[str, int], times: int = 1) -> dict:
    """{(kind, axes): [count, bytes]} per step for a program run `times` times a step."""
    rows: dict[tuple[str, str], list[int]] = {}
    for c in hlo.collectives(text):
        axes = mesh_axes_of(parse_groups(c.groups), mesh_shape) if c.groups else "?"
        entry = rows.setdefault((c.kind, axes), [0, 0])
        entry[0] += times
        entry[1] += times * c.bytes
    return rows


def per_device_bytes(tree: Any) -> int:
    """Largest per-device share of a placed pytree (read from its shards)."""
    per: dict = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            per[shard.device] = per.get(shard.device, 0) + shard.data.nbytes
    return max(per.values()) if per else 0


def _chunk_args(strategy: Pipeline, state, batch, c: int) -> dict[str, tuple]:
    """Example arguments for each program chunk c's train step runs (shapes are what matter;
    residuals and gradients come from running the chunk's programs, so they are real)."""
    progs, k = strategy.programs, strategy.num_stages
    last = c == strategy.num_chunks - 1
    x = batch["image"][0]
    for prev in range(c):  # walk the forward to this chunk's input
        p = state.stages[prev]
        x, _ = progs["fwd"][prev](p.params, p.batch_stats, x)
        x = jax.device_put(x, strategy.batch_sharding[(prev + 1) % k])
    st, acc = state.stages[c], state.grad_acc[c]
    label = batch["label"][0]
    cot = () if last else (jnp.zeros_like(progs["fwd"][c](st.params, st.batch_stats, x)[0]),)
    args: dict[str, tuple] = {}
    if strategy.remat:
        if not last:
            args["fwd"] = (st.params, st.batch_stats, x)
        args["bwd"] = (st.params, st.batch_stats, x, *(cot or (label,)), acc)
    else:
        args["fwd_res"] = (st.params, st.batch_stats, x, *(() if cot else (label,)))
        res = progs["fwd_res"][c](*args["fwd_res"])[2]
        if strategy.split_backward:
            args["bwd_in"] = (st.params, res, *cot)
            out = progs["bwd_in"][c](*args["bwd_in"])
            args["bwd_w"] = (st.params, res, out if c == 0 else out[1], acc)
        else:
            args["bwd_res"] = (st.params, res, *cot, acc)
    args["update"] = (st, acc)
    return args


def programs(strategy, state, batch) -> list[tuple[str, int, Any, dict[str, int]]]:
    """The compiled programs of one train step: (where, times per step, compiled, mesh shape).
    `where` is "step" for one-program strategies and "stage s" for each pipeline stage."""
    if not isinstance(strategy, Pipeline):
        compiled = strategy.compiled or strategy.compile(state, batch)
        return [("step", 1, compiled, dict(strategy.mesh.shape))]
    out = []
    for c in range(strategy.num_chunks):
        s = c % strategy.num_stages
        for name, args in _chunk_args(strategy, state, batch, c).items():
            times = 1 if name == "update" else strategy.num_microbatches
            compiled = strategy.programs[name][c].lower(*args).compile()
            out.append((f"stage {s}", times, compiled, dict(strategy.meshes[s].shape)))
    return out


def step_flops(strategy, state, batch) -> float:
    """FLOPs of one train step over all devices' programs, from XLA's cost analysis of the
    compiled programs (per device, times the devices of each program's mesh)."""
    total = 0.0
    for _, times, compiled, mesh_shape in programs(strategy, state, batch):
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        total += times * float(cost.get("flops", 0.0)) * int(np.prod(list(mesh_shape.values())))
    return total


def collectives(compiled_programs) -> dict[tuple[str, str, str], list[int]]:
    """{(where, kind, axes): [count, bytes per device]} per step, over every program."""
    rows: dict = {}
    for where, times, compiled, shape in compiled_programs:
        for (kind, axes), (count, nbytes) in collective_rows(
            compiled.as_text(), shape, times
        ).items():
            entry = rows.setdefault((where, kind, axes), [0, 0])
            entry[0] += count
            entry[1] += nbytes
    return rows


def ring_allreduce_wire_bytes(payload: int, n: int) -> float:
    """Bytes each device sends in a ring all-reduce of `payload` bytes over n devices:
    reduce-scatter then all-gather, (n-1)/n of the payload each: 2(n-1)/n x payload."""
    return 2 * (n - 1) / n * payload if n > 1 else 0.0


def _best(fn, repeats: int) -> float:
    """Smallest wall time of fn() over `repeats` runs, after one warm-up, device synchronised."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def pipeline_state_bytes(strategy: Pipeline, state) -> list[int]:
    """Per stage, the bytes one of its devices holds for parameters, optimizer state,
    batch statistics and the gradient accumulator (read from the placed arrays; every chunk
    the stage holds)."""
    k = strategy.num_stages
    chunks = list(zip(state.stages, state.grad_acc))
    return [per_device_bytes(chunks[s::k]) for s in range(k)]


def measure_pipeline(strategy: Pipeline, state, batch, repeats: int = 3) -> dict[str, Any]:
    """Time each chunk's forward, backward (B) and weight-gradient (W, zero-bubble schedules)
    programs alone (device synchronised, best of `repeats`), then place the schedule's events
    on a clock with those durations.

    Returns per-chunk seconds per micro-batch, the bubble of that timeline, and the analytic
    bubble. On hardware where stages have their own processors this timeline is what the
    dispatcher achieves; on simulated CPU devices sharing cores, wall time is longer because
    stages also compete for the cores.
    """
    progs, n = strategy.programs, strategy.num_chunks
    fwd_t, bwd_t, wgt_t = [0.0] * n, [0.0] * n, [0.0] * n
    for c in range(n):
        args = _chunk_args(strategy, state, batch, c)
        for name, times in (("fwd", fwd_t), ("fwd_res", fwd_t), ("bwd", bwd_t),
                            ("bwd_res", bwd_t), ("bwd_in", bwd_t), ("bwd_w", wgt_t)):  # fmt: skip
            if name not in args:
                continue
            if name not in ("bwd", "bwd_res", "bwd_w"):
                times[c] = _best(lambda f=progs[name][c], a=args[name]: f(*a), repeats)
                continue
            # The accumulator (last argument) is donated: keep the one each call returns.
            held = {"acc": jax.tree.map(jnp.copy, args[name][-1])}

            def run(f=progs[name][c], a=args[name][:-1], name=name, c=c, held=held):
                out = f(*a, held["acc"])
                held["acc"] = out if (name == "bwd_w" or c == 0) else out[1]
                return out

            times[c] = _best(run, repeats)
    line = schedules.timeline(strategy.events, fwd_t, bwd_t, wgt_t)
    return {
        "stage_forward_s": fwd_t,
        "stage_backward_s": bwd_t,
        "stage_weight_grad_s": wgt_t,
        "measured_bubble": line.bubble,
        "timeline_step_s": line.makespan,
        "sequential_step_s": sum(line.busy),
        "analytic_bubble": strategy.analytic_bubble(),
    }


def collective_summary(rows: list[list], data_size: int) -> dict[str, Any]:
    """Totals from [where, kind, axes, count, bytes] rows: bytes per device per step of the
    busiest program group, its breakdown by kind and by mesh axis, and the all-reduce over
    "data" (the gradient average) beside its ring wire estimate 2(N-1)/N x payload."""
    crossing = [r for r in rows if r[2] != "none"]
    groups: dict[str, int] = {}
    for where, _, _, _, nbytes in crossing:
        groups[where] = groups.get(where, 0) + nbytes
    busiest = max(groups, key=groups.get) if groups else None
    by_kind: dict[str, int] = {}
    by_axis: dict[str, int] = {}
    for where, kind, axes, _, nbytes in crossing:
        if where == busiest:
            by_kind[kind] = by_kind.get(kind, 0) + nbytes
            by_axis[axes] = by_axis.get(axes, 0) + nbytes
    payload = by_kind_axis(crossing, busiest, "all-reduce", "data")
    return {
        "collectives": rows,
        "collective_bytes_per_device": groups[busiest] if busiest else 0,
        "collective_bytes_by_kind": by_kind,
        "collective_bytes_by_axis": by_axis,
        "data_allreduce_bytes": payload,
        "ring_allreduce_wire_bytes": ring_allreduce_wire_bytes(payload, data_size),
    }


def by_kind_axis(rows: list[list], where: str | None, kind: str, axes: str) -> int:
    """Bytes of collectives of `kind` over exactly mesh axes `axes` in program group `where`."""
    return sum(r[4] for r in rows if r[0] == where and r[1] == kind and r[2] == axes)


def _temp_bytes(compiled) -> int:
    return int(compiled.memory_analysis().temp_size_in_bytes)


def report(strategy, state, batch, batch_size: int, timing: bool = True) -> dict[str, Any]:
    """Every figure of one step, with the same keys for every strategy (None: not applicable).

    Memory per device = placed state + compiled temporaries + stored stage inputs (pipelines),
    for the busiest device. Collective bytes per device: the busiest program group (the
    whole step, or the busiest pipeline stage); the by-kind and by-axis breakdowns are that
    group's, over collectives that cross devices (groups of one device move nothing).
    """
    compiled = programs(strategy, state, batch)
    rows = collectives(compiled)
    pipe = isinstance(strategy, Pipeline)
    k = strategy.num_stages if pipe else 1
    stage_list = [list(state.stages)[s::k] for s in range(k)] if pipe else [[state]]
    params = [per_device_bytes([st.params for st in sts]) for sts in stage_list]
    opt = [per_device_bytes([st.opt_state for st in sts]) for sts in stage_list]
    if pipe:
        state_b = pipeline_state_bytes(strategy, state)
        temp = [0] * strategy.num_stages
        for where, _, prog, _ in compiled:
            s = int(where.split()[1])
            temp[s] = max(temp[s], _temp_bytes(prog))
        stash = [
            schedules.in_flight(ev) * batch["image"][0].nbytes // strategy.data
            for ev in strategy.events
        ]
        if not strategy.remat or strategy.num_chunks > strategy.num_stages:
            stash = list(strategy.peak_stash_bytes)  # residuals, chunks: the measured peak
    else:
        state_b, temp, stash = [per_device_bytes(state)], [_temp_bytes(compiled[0][2])], [0]
    memory = [a + b + c for a, b, c in zip(state_b, temp, stash)]
    data_size = strategy.mesh.shape["data"]
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
            [[w, k, a, c, b] for (w, k, a), (c, b) in sorted(rows.items())], data_size
        ),
        "num_stages": strategy.num_stages if pipe else 1,
        "pipeline_schedule": strategy.schedule if pipe else None,
        "num_microbatches": strategy.num_microbatches if pipe else None,
        "stage_bounds": list(strategy.bounds) if pipe else None,
        "analytic_bubble": (strategy.analytic_bubble() if pipe else None),
        "measured_bubble": None,
        "bytes_between_stages_per_step": strategy.bytes_between_stages(batch_size)
        if pipe
        else None,
        "bytes_between_stages_per_replica": (
            strategy.bytes_between_stages(batch_size) // strategy.data if pipe else None
        ),
        "peak_stash_bytes_per_device": list(strategy.peak_stash_bytes) if pipe else None,
        "stage_state_bytes_per_device": state_b if pipe else None,
        "stage_program_temp_bytes": temp if pipe else None,
    }
    if pipe and timing:
        out["measured_bubble"] = measure_pipeline(strategy, state, batch)["measured_bubble"]
    return out
