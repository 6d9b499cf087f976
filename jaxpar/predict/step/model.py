"""Predict a partitioning's step on a hardware profile: compute, exposed communication, bubble.

Assumptions, all stated (and the switchable one in the profile):
- Compute: each compiled program's own operation classes (jaxpar.predict.kernels.opclass, per device
  per call: a recomputing backward counts its forward again, a zero-bubble B and W each their
  half): convolution and matmul FLOPs at calibrated fractions of peak (3x3 stride-1
  convolutions at their own), memory-bound bytes at the memory bandwidth, a device time per
  kernel; and the host's time to launch the kernels, which overlaps the device's: a program
  takes the longer of the two (pricing.program_time).
- Collectives: the compiled programs' own (kind, axes, bytes), priced by hardware.py's ring
  formulas on the links the group spans. Collectives inside forward/backward (tensor
  parallelism, synchronised BatchNorm) sit on the critical path.
- Gradient reduction over the batch axes: read from the compiled program (overlap.py): under
  the work between an asynchronous collective's start and done where the program has such
  pairs (XLA:CPU's have none: nothing hides, as jaxpar's step measures); with the profile's
  `overlap = None` (a GPU compiler, which starts each collective when its operand is ready),
  what of the gradients, sent one after another from their ready points, ends before the
  compute does; else a fixed fraction `overlap` of it, at most 2/3 of the step's compute
  (0 = after the backward, 1 = all of it).
- Pipelines: every chunk's F, B and W events on the schedule's own timeline
  (schedules.timeline, any schedule the trainer runs), with durations = compute + in-program
  collectives + the boundary transfer the event sends; a stage's update (and its gradient
  collectives) starts after its last event.
- The pipeline runner's host time: per step, per stage, per micro-batch and per program or
  transfer dispatched, the per-stage and per-dispatch costs growing with the devices of a
  stage (the profile's overheads; measured on simulated CPU devices by pipelinehost.measure_host).
- A forward-only program (a pipeline chunk's F) at the profile's forward_speedup over its op
  classes' price (XLA:CPU's backward carries memory-bound work its FLOPs do not show).
- compute_pool (simulated CPU devices): N busy devices together reach pool(N, size) times one
  device's rate (measured: calibrate.measure_pool), each pool/N of it, where size is the mean
  FLOPs of the step's matrix kernels (a pipeline's micro-batch programs and a tensor split's
  narrow ones have small kernels, which leave more of the cores to the other devices); a
  pipeline step takes at least the total work of all devices at the pool's rate.
"""

from __future__ import annotations

import dataclasses

from jaxpar import axes
from jaxpar.parallel import schedules
from jaxpar.predict.comm import commtime
from jaxpar.predict.profiles.hardware import Profile
from jaxpar.predict.programs.workload import Workload
from jaxpar.predict.records import PredictedRow
from jaxpar.predict.step import pricing


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """A step's predicted parts (s): compute, exposed communication, bubble, host overhead,
    the gradient collectives' time, and a pipeline schedule's own bubble fraction."""

    compute_s: float
    comm_s: float
    bubble_s: float
    overhead_s: float
    grad_allreduce_s: float
    schedule_bubble: float | None = None  # pipelines only


def _seconds(ops, w: Workload, profile: Profile, share: float = 1.0) -> float:
    """A program's time on one device that gets `share` of a device's compute."""
    return max(
        pricing.device_time(profile, ops, w.dtype, w.name) / share, pricing.host_time(profile, ops)
    )


def _phase_seconds(ck, phase: str, w: Workload, profile: Profile) -> float:
    """One call of chunk `ck`'s program for `phase`, a forward-only one at the profile's
    forward_speedup."""
    seconds = _seconds(ck.op_classes(phase), w, profile)
    return seconds / profile.compute.forward_speedup if phase == "fwd" else seconds


def _share(w: Workload, profile: Profile) -> float:
    """Each device's share of one device's rate when all N are busy at once (compute_pool)."""
    if profile.cpu.compute_pool and not w.schedule:
        return pricing.pool(profile, w.num_devices, kernel_flops(w)) / w.num_devices
    return 1.0


def kernel_flops(w: Workload) -> float | None:
    """Mean FLOPs of the matrix kernels of one step, over all its programs and their calls
    (None where none were read): the size a shared pool's speedup depends on."""
    flops = count = 0.0
    for c in w.chunks:
        for phase in c.flops:
            calls = schedules.calls_per_step(phase, w.num_microbatches)
            matmuls = c.op_classes(phase).matmuls
            flops += calls * sum(m.flops for m in matmuls)
            count += calls * len(matmuls)
    return flops / count if count else None


def predict_workload(w: Workload, profile: Profile) -> PredictedRow:
    """Predicted step of workload `w` on `profile`: times (s), images/sec, memory and fit."""
    if w.num_devices > profile.device.num_devices:
        return _row(
            w,
            profile,
            None,
            f"needs {w.num_devices} devices, profile has {profile.device.num_devices}",
        )
    last = commtime.placement(w.mesh_shape, profile)(w.num_devices - 1)
    if last >= profile.device.num_devices:
        nodes = profile.device.num_devices // profile.device.devices_per_node
        return _row(
            w,
            profile,
            None,
            f"places each node index on nodes of its own: needs "
            f"{last // profile.device.devices_per_node + 1} nodes, profile has {nodes}",
        )
    if not w.schedule:
        (chunk,) = w.chunks
        compute = _seconds(chunk.op_classes("step"), w, profile, _share(w, profile))
        cols = chunk.collectives.get("step", ())
        sync = [commtime.is_grad_sync(c, "step", w.mesh_shape) for c in cols]
        grad = commtime.collectives_time(
            [c for c, g in zip(cols, sync) if g], w.mesh_shape, profile
        )
        other = commtime.collectives_time(
            [c for c, g in zip(cols, sync) if not g], w.mesh_shape, profile
        )
        hidden = commtime.hidden(chunk.windows.get("step", ()), grad, compute, w, profile)
        times = StepTimes(
            compute_s=compute,
            comm_s=other + grad - hidden,
            bubble_s=0.0,
            overhead_s=profile.host.step_overhead_s + profile.host.program_overhead_s,
            grad_allreduce_s=grad,
        )
    else:
        times = _pipeline_times(w, profile)
    if profile.cpu.compute_pool and w.schedule:  # the pool is work-conserving: stages that
        # wait lend their cores to the others, but the step is at least all work / pool rate
        total = _total_compute(w, profile)
        if total > times.compute_s + times.bubble_s:
            times = dataclasses.replace(times, compute_s=total, bubble_s=0.0)
    return _row(w, profile, times)


def _total_compute(w: Workload, profile: Profile) -> float:
    """Seconds of the whole step's device work over all devices at the pool's rate."""
    per_stage = w.num_devices // len(w.stages)  # devices running each chunk's programs
    total = 0.0
    for c in w.chunks:
        for phase in c.flops:
            times = schedules.calls_per_step(phase, w.num_microbatches)
            seconds = pricing.device_time(profile, c.op_classes(phase), w.dtype, w.name)
            total += times * seconds / (profile.compute.forward_speedup if phase == "fwd" else 1.0)
    return total * per_stage / pricing.pool(profile, w.num_devices, kernel_flops(w))


_PHASES = ("fwd", "bwd", "wgt")  # a pipeline chunk's programs: forward, backward, weights


def _pipeline_times(w: Workload, profile: Profile) -> StepTimes:
    k, m = axes.num_stages(w.mesh_shape), w.num_microbatches
    d = w.num_devices // k  # devices per stage: every program and transfer dispatches to d
    # Groups of a stage's collectives: its programs name mesh axes of the stage's own mesh
    # (the stage axis at size 1); in the full mesh stage s's devices are those with stage
    # index s, the first of them `first(s)` in mesh order.
    full, over = w.mesh_shape, profile.host.program_overhead_s
    first = lambda s: commtime.stage_start(w, s)
    n = len(w.chunks)
    fwd, bwd, wgt = [0.0] * n, [0.0] * n, [0.0] * n
    compute, comm = [0.0] * k, [0.0] * k
    for ck in w.chunks:
        c = ck.chunk
        coll = tuple(  # (forward, backward, weight gradient)
            commtime.collectives_time(ck.collectives.get(phase, ()), full, profile, first(ck.stage))
            for phase in _PHASES
        )
        send = commtime.send_time(w, c, profile)
        recv_grad = commtime.send_time(w, c - 1, profile) if c else 0.0
        flop_s = tuple(
            _phase_seconds(ck, phase, w, profile) if phase in ck.flops else 0.0 for phase in _PHASES
        )
        fwd[c] = flop_s[0] + coll[0] + send + over
        bwd[c] = flop_s[1] + coll[1] + recv_grad + over
        wgt[c] = flop_s[2] + coll[2] + (over if "wgt" in ck.flops else 0.0)
        compute[ck.stage] += sum(flop_s) * m
        comm[ck.stage] += (sum(coll) + send + recv_grad) * m
    line = schedules.timeline([list(e) for e in w.events], fwd, bwd, wgt)
    finish = [0.0] * k
    for (_, c, _), (_, end) in line.spans.items():
        stage = w.chunks[c].stage
        finish[stage] = max(finish[stage], end)
    grads = [0.0] * k
    for ck in w.chunks:
        grads[ck.stage] += commtime.collectives_time(
            ck.collectives.get("update", ()), full, profile, first(ck.stage)
        )
    step = max(f + g for f, g in zip(finish, grads))
    busiest = max(range(k), key=lambda s: line.busy[s])
    if profile.cpu.compute_pool:  # one host thread dispatches every stage's programs and
        # transfers on the cores the devices compute on: all of them cost the step
        crossings = sum(commtime.send_time(w, ck.chunk, profile) > 0 for ck in w.chunks)
        programs = sum(len(ck.flops) - 1 for ck in w.chunks) + 2 * crossings  # per mb
    else:  # dispatch overlaps other stages' work: the busiest stage's programs
        programs = sum(len(ck.flops) - 1 for ck in w.chunks if ck.stage == busiest)
    per_stage = profile.host.stage_overhead_s + (d - 1) * profile.host.stage_device_overhead_s
    per_dispatch = over + (d - 1) * profile.host.program_device_overhead_s
    host = profile.host.step_overhead_s + k * per_stage
    host += m * (profile.host.microbatch_overhead_s + programs * per_dispatch)
    return StepTimes(
        compute_s=compute[busiest],
        comm_s=comm[busiest] + step - line.makespan,
        bubble_s=line.makespan - line.busy[busiest],
        overhead_s=host,
        grad_allreduce_s=max(grads),
        schedule_bubble=line.bubble,
    )


def _row(w: Workload, profile: Profile, times: StepTimes | None, why: str = "") -> PredictedRow:
    row = PredictedRow(
        profile=profile.name,
        model=w.name,
        mesh_shape=tuple(w.mesh_shape.values()),
        mesh_axes=tuple(w.mesh_shape),
        num_devices=w.num_devices,
        global_batch_size=w.global_batch,
        schedule=w.schedule or None,
        num_microbatches=w.num_microbatches if w.schedule else None,
        memory_bytes_per_device=w.memory_bytes_per_device,
        memory_from=w.compiled_for,
        memory_capacity_bytes=profile.device.memory_bytes,
        fits=w.memory_bytes_per_device <= profile.device.memory_bytes,
        param_bytes=w.param_bytes,
        overlap=profile.links.overlap,
        status="failed",
        error=why,
    )
    if times is None:
        return row
    step = times.compute_s + times.comm_s + times.bubble_s + times.overhead_s
    loader = profile.host.loader_images_per_sec
    input_bound = bool(loader) and w.global_batch / step > loader
    wait = None
    if input_bound:  # the devices wait for the loader: the step lasts as long as its batch
        wait = w.global_batch / loader - step
        step = w.global_batch / loader
    return dataclasses.replace(
        row,
        status="ok",
        error=None,
        step_time_s=step,
        **dataclasses.asdict(times),
        input_wait_s=wait,
        input_bound=input_bound,
        images_per_sec=w.global_batch / step,
        analytic_bubble=(
            schedules.analytic_bubble(
                axes.num_stages(w.mesh_shape),
                w.num_microbatches,
                w.schedule,
                len(w.chunks) // axes.num_stages(w.mesh_shape),
            )
            if w.schedule
            else None
        ),
    )
