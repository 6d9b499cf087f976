"""What a step costs, read from the placed state and the compiled programs: memory per device,
collectives per device per step (kind, mesh axis, bytes), bytes between pipeline stages, and
the pipeline bubble (analytic, and from measured stage times).

Kept apart from the modules that execute steps: strategies run, this module looks at them.
`report` returns the same keys for every strategy (None where a figure does not apply); it is
what `Strategy.report`, the trainer's summary, `--explain` and `python -m jaxpar.bench` read.
Bytes and memory are exact and machine-independent; stage times are this machine's.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp

from jaxpar import axes as axes_lib
from jaxpar import collectives as collectives_lib
from jaxpar.parallel import schedules
from jaxpar.parallel.strategy import per_device_bytes


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
    return sum(
        p.times * program_flops(p.compiled) * p.num_devices for p in programs(strategy, batch_size)
    )


def zeros_for(program):
    """A program that makes zeros for `program`'s arguments, placed and laid out as its
    compiled executable takes them (one program, not one per leaf)."""
    zeros = lambda: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), program.args)
    return jax.jit(zeros, out_shardings=program.compiled.input_formats[0])


def time_program(program, repeats: int = 3) -> float:
    """Smallest wall time of one call of a compiled program over `repeats` runs after a
    warm-up, device synchronised; fresh arguments each call (some are donated)."""
    make_args = zeros_for(program)
    times = []
    for i in range(repeats + 1):
        args = jax.block_until_ready(make_args())
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
    clocks = {
        "forward": [0.0] * n,
        "backward": [0.0] * n,
        "backward input": [0.0] * n,
        "backward weights": [0.0] * n,
    }
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


def _temp_bytes(compiled) -> int:
    return int(compiled.memory_analysis().temp_size_in_bytes)


def stage_memory(strategy, batch_size: int, progs) -> tuple[list[int], list[int], list[int]]:
    """Per device stage, one device's bytes of placed state (abstract), of its programs'
    largest temporaries, and of stored activations at the schedule's peak."""
    k = strategy.num_stages
    state = [per_device_bytes(pairs) for pairs in strategy.stage_states(strategy.state_shapes())]
    temp = [
        max((_temp_bytes(p.compiled) for p in progs if p.stage == s), default=0) for s in range(k)
    ]
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


def _memory_figures(strategy, batch_size: int, progs) -> tuple[dict[str, Any], tuple]:
    """The report's memory figures, and the per-stage (state, temporaries, stash) bytes."""
    pipe = strategy.schedule is not None
    per_stage = strategy.stage_states(strategy.state_shapes())
    params = [per_device_bytes([st.params for st, _ in pairs]) for pairs in per_stage]
    opt = [per_device_bytes([st.opt_state for st, _ in pairs]) for pairs in per_stage]
    state_b, temp, stash = stage_memory(strategy, batch_size, progs)
    memory = [a + b + c for a, b, c in zip(state_b, temp, stash)]
    figures = {
        "param_bytes": int(strategy.model.num_params * 4),
        "param_bytes_per_device": max(params),
        "opt_state_bytes_per_device": max(opt),
        "state_bytes_per_device": max(state_b),
        "program_temp_bytes_per_device": max(temp),
        "stored_activation_bytes_per_device": max(stash) if pipe else None,
        "memory_bytes_per_device": max(memory),
        "memory_per_device_bytes": memory,  # per stage for pipelines, one entry otherwise
    }
    return figures, (state_b, temp, stash)


def _pipeline_figures(strategy, batch_size: int, progs, stages: tuple) -> dict[str, Any]:
    """The report's stage figures (None where the strategy has no pipeline); the measured
    ones are filled in by `report` when it times the pipeline."""
    state_b, temp, stash = stages
    pipe = strategy.schedule is not None
    return {
        "num_stages": strategy.num_stages,
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
        "bytes_between_stages_per_step": strategy.bytes_between_stages(batch_size),
        "stage_transfer_bytes_per_device": stage_transfer_bytes(strategy, batch_size, progs)
        if pipe
        else None,
        "peak_stash_bytes_per_device": stash if pipe else None,
        "stage_state_bytes_per_device": state_b if pipe else None,
        "stage_program_temp_bytes": temp if pipe else None,
    }


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
    rows = collectives_lib.collectives(progs, strategy.conditional_period())
    pipe = strategy.schedule is not None
    shape = dict(strategy.mesh.shape)
    memory, stages = _memory_figures(strategy, batch_size, progs)
    out: dict[str, Any] = {
        **memory,
        **collectives_lib.collective_summary(
            collectives_lib.per_step_rows(rows),
            axes_lib.num_replicas(shape),
            "+".join(axes_lib.replica_axes(shape)),  # "" where nothing replicates
        ),
        **_pipeline_figures(strategy, batch_size, progs, stages),
    }
    if pipe and timing:
        line = measure_pipeline(strategy, batch_size)
        out["measured_bubble"] = line["measured_bubble"]
        out["stage_time_measured_s"] = line["stage_time_s"]
    return out
