"""Predict a partitioning's step on a hardware profile: compute, exposed communication, bubble.

Assumptions, all stated (and the switchable one in the profile):
- Compute: forward FLOPs per device x local batch at the profile's achieved FLOP/s (peak x a
  compute efficiency calibrated on one measured single-device run); backward = 2 x forward, or
  3 x forward in pipeline stages, whose backward recomputes the forward (jaxpar remats).
- Collectives: the compiled programs' own (kind, axes, bytes), priced by hardware.py's ring
  formulas on the links the group spans. Collectives inside forward/backward (tensor
  parallelism, synchronised BatchNorm) sit on the critical path.
- Gradient all-reduce over `data`: a fraction `overlap` of it may hide under the backward
  pass (never more than the backward lasts); the rest is exposed. 0 = all-reduce after the
  backward (what jaxpar's step does), 1 = perfect overlap.
- Pipelines: each stage's events on the schedule's timeline (schedules.timeline) with
  durations = compute + in-program collectives + the stage-boundary transfer it sends; the
  stage's gradient all-reduce starts after its last backward.
- compute_pool (simulated CPU devices): the devices share the compute of `compute_pool`
  devices (cores), so N busy devices each run at min(1, pool/N) of one device's rate, and a
  pipeline step takes at least the total work of all devices at the pool's rate.
"""

from __future__ import annotations

from typing import Any

from jaxpar.parallel import schedules
from jaxpar.predict import hardware
from jaxpar.predict.hardware import Profile
from jaxpar.predict.workload import StageCost, Workload


def _is_grad_sync(c, program: str) -> bool:
    """The data-parallel gradient all-reduce (what `overlap` applies to)."""
    return c.kind == "all-reduce" and c.axes == "data" and program in ("step", "update")


def _comm(cols, mesh_shape: dict[str, int], profile: Profile, first_device: int = 0) -> float:
    total = 0.0
    for c in cols:
        group = [first_device + i for i in hardware.group_of(c.axes, mesh_shape)]
        total += (
            hardware.collective_time(c.kind, c.bytes / max(c.count, 1), group, profile) * c.count
        )
    return total


def _rate(w: Workload, profile: Profile) -> float:
    rate = profile.flops_per_s(w.dtype)
    if profile.compute_pool and not w.schedule:  # N busy devices share the pool
        rate *= min(1.0, profile.compute_pool / w.num_devices)
    return rate


def predict_workload(w: Workload, profile: Profile) -> dict[str, Any]:
    """Predicted step of workload `w` on `profile`: times (s), images/sec, memory and fit."""
    if w.num_devices > profile.num_devices:
        return _row(w, profile, None, f"needs {w.num_devices} devices, profile has "
                    f"{profile.num_devices}")  # fmt: skip
    rate = _rate(w, profile)
    d = w.mesh_shape["data"]
    if not w.schedule:
        stage = w.stages[0]
        local = w.global_batch / d
        fwd = stage.fwd_flops_per_example * local / rate
        bwd = 2 * fwd
        cols = stage.collectives["step"]
        grad = _comm([c for c in cols if _is_grad_sync(c, "step")], w.mesh_shape, profile)
        other = _comm([c for c in cols if not _is_grad_sync(c, "step")], w.mesh_shape, profile)
        hidden = min(profile.overlap * grad, bwd)
        times = {
            "compute_s": fwd + bwd,
            "comm_s": other + grad - hidden,
            "bubble_s": 0.0,
            "overhead_s": profile.step_overhead_s + profile.program_overhead_s,
            "grad_allreduce_s": grad,
        }
    else:
        times = _pipeline_times(w, profile, rate)
    if profile.compute_pool and w.schedule:  # the pool is work-conserving: stages that
        # wait lend their cores to the others, but the step is at least all work / pool rate
        total = _total_compute(w, profile)
        if total > times["compute_s"] + times["bubble_s"]:
            times["compute_s"], times["bubble_s"] = total, 0.0
    return _row(w, profile, times)


def _total_compute(w: Workload, profile: Profile) -> float:
    """Seconds of the whole step's compute over all devices at the pool's rate."""
    pool = profile.flops_per_s(w.dtype) * min(profile.compute_pool, w.num_devices)
    backward = 3 if w.schedule else 2
    flops = sum(
        s.fwd_flops_per_example * (1 + backward) * w.global_batch * w.mesh_shape["tensor"]
        for s in w.stages
    )
    return flops / pool


def _pipeline_times(w: Workload, profile: Profile, rate: float) -> dict[str, float]:
    k, m = w.mesh_shape["stage"], w.num_microbatches
    d, t = w.mesh_shape["data"], w.mesh_shape["tensor"]
    # Groups of a stage's collectives: its programs name mesh axes of the stage's own mesh
    # (data, 1, tensor); in the full mesh stage s's devices are those with stage index s.
    full = w.mesh_shape
    local = w.global_batch / m / d
    per_stage = t  # device index stride between stages in (data, stage, tensor) order
    fwd, bwd, compute, comm = [], [], [], []
    for s, st in enumerate(w.stages):
        first = s * per_stage
        f = st.fwd_flops_per_example * local / rate
        f_comm = _comm(st.collectives.get("fwd", ()), full, profile, first)
        b_comm = _comm(st.collectives.get("bwd", ()), full, profile, first)
        send = _send_time(st, s, profile, per_stage)
        recv_grad = _send_time(w.stages[s - 1], s - 1, profile, per_stage) if s else 0.0
        over = profile.program_overhead_s
        fwd.append(f + f_comm + send + over)
        bwd.append(3 * f + b_comm + recv_grad + over)  # backward recomputes the forward
        compute.append(4 * f * m)
        comm.append((f_comm + send + b_comm + recv_grad) * m)
    line = schedules.timeline([list(e) for e in w.events], fwd, bwd)
    finish = [max(end for (_, st, _), (_, end) in line.spans.items() if st == s) for s in range(k)]
    grads = []
    for s, st in enumerate(w.stages):
        upd = st.collectives.get("update", ())
        g = _comm(upd, full, profile, s * per_stage)
        grads.append(g)
    step = max(f + g for f, g in zip(finish, grads))
    busiest = max(range(k), key=lambda s: line.busy[s])
    return {
        "compute_s": compute[busiest],
        "comm_s": comm[busiest] + step - line.makespan,
        "bubble_s": line.makespan - line.busy[busiest],
        "overhead_s": profile.step_overhead_s + 2 * m * profile.program_overhead_s,
        "grad_allreduce_s": max(grads),
        "schedule_bubble": line.bubble,
    }


def _send_time(st: StageCost, s: int, profile: Profile, stride: int) -> float:
    """Seconds to send stage s's output activation (per device) to stage s+1."""
    link = hardware.transfer_link(s * stride, (s + 1) * stride, profile)
    return hardware.p2p_time(st.send_bytes, link)


def _row(w: Workload, profile: Profile, times: dict | None, why: str = "") -> dict[str, Any]:
    mesh = tuple(w.mesh_shape.values())
    row: dict[str, Any] = {
        "profile": profile.name,
        "mesh_shape": mesh,
        "num_devices": w.num_devices,
        "global_batch_size": w.global_batch,
        "schedule": w.schedule or None,
        "num_microbatches": w.num_microbatches if w.schedule else None,
        "memory_bytes_per_device": w.memory_bytes_per_device,
        "memory_capacity_bytes": profile.memory_bytes,
        "fits": w.memory_bytes_per_device <= profile.memory_bytes,
        "param_bytes": w.param_bytes,
        "overlap": profile.overlap,
    }
    if times is None:
        return {**row, "status": "failed", "error": why}
    step = times["compute_s"] + times["comm_s"] + times["bubble_s"] + times["overhead_s"]
    return {
        **row,
        "status": "ok",
        "step_time_s": step,
        **times,
        "images_per_sec": w.global_batch / step,
        "analytic_bubble": (
            schedules.analytic_bubble(w.mesh_shape["stage"], w.num_microbatches)
            if w.schedule
            else None
        ),
    }
