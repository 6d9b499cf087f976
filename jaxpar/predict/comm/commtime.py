"""What a step's communication costs on a profile's links: its collectives (each at its link
price, an in-step one also on cores the devices share), the gradient reduction's part hidden
under the compute, a pipeline chunk's send to the next stage, and where each mesh device sits
among the profile's nodes (model.py adds these to the compute)."""

from __future__ import annotations

import math
from collections import Counter

from jaxpar import axes
from jaxpar import mesh as mesh_lib
from jaxpar.predict.comm import links, overlap
from jaxpar.predict.profiles.hardware import Profile
from jaxpar.predict.programs.workload import Workload
from jaxpar.predict.step import pricing


def is_grad_sync(c, phase: str, mesh_shape: dict[str, int]) -> bool:
    """The data-parallel gradient reduction (what `overlap` applies to): an all-reduce or
    reduce-scatter over batch axes only (data; node x data's three steps but the final
    all-gather; fsdp's reduce-scatters) or axes that sum whole parameters' gradients too
    (spatial), in a whole step or a stage's update."""
    batch = {a for a in mesh_shape if axes.get(a).role == "batch" or axes.get(a).sums_gradients}
    return (
        c.kind in ("all-reduce", "reduce-scatter")
        and set(c.axes.split("+")) <= batch
        and phase in ("step", "update")
    )


def hidden(windows, grad: float, compute: float, w: Workload, profile: Profile) -> float:
    """Seconds of the gradient reduction (`grad` in all) that run under the step's compute:
    under the work between an asynchronous collective's start and done where the program has
    such pairs; where the profile says `overlap = None` (a GPU's compiler: asynchronous
    collectives started once their operand is ready), what of the gradients, sent one after
    another from their ready points, ends before the compute does; else the profile's fixed
    fraction `overlap` of it, at most the backward (2/3 of the compute)."""
    mine = [x for x in windows if is_grad_sync(x, "step", w.mesh_shape)]
    own = window_times(mine, w.mesh_shape, profile)
    total = sum(own)
    if not grad or not total:
        return 0.0
    times = [grad * t / total for t in own]  # each its own price: a small one its latency
    if any(x.between is not None for x in mine):
        return sum(min(t, (x.between or 0.0) * compute) for t, x in zip(times, mine))
    if profile.links.overlap is None:
        return grad - overlap.exposed(times, [x.ready for x in mine], compute)
    return min(profile.links.overlap * grad, compute * 2 / 3)


def window_times(windows, mesh_shape: dict[str, int], profile: Profile) -> list[float]:
    """Each collective element's own seconds at its link price: a collective's latency is
    its own, not spread over the others by bytes (a step of many small all-reduces, such as
    synchronised BatchNorm's, and a few large gradient ones, costs its latency in the small
    ones); a combined collective's price split over its elements by bytes."""
    place = placement(mesh_shape, profile)
    out = []
    for x in windows:
        group = [place(i) for i in links.group_of(x.axes, mesh_shape)]
        whole = x.whole or x.bytes
        price = links.collective_time(x.kind, whole, group, profile)
        out.append(price * x.bytes / whole if whole else 0.0)
    return out


def collectives_time(
    cols, mesh_shape: dict[str, int], profile: Profile, first_device: int = 0
) -> float:
    """Seconds of collectives `cols`: each call at its link price for its own size (a row's
    `sizes`; without them, `count` calls of bytes / count), and an in-step one (not the
    gradient sync) also at what it costs cores the devices share (pricing.shared_core_time)."""
    total = 0.0
    place = placement(mesh_shape, profile)
    devices = math.prod(mesh_shape.values())
    for c in cols:
        group = [place(first_device + i) for i in links.group_of(c.axes, mesh_shape)]
        calls = Counter(c.sizes) if c.sizes else {c.bytes / max(c.count, 1): c.count}
        for size, count in sorted(calls.items()):
            total += links.collective_time(c.kind, size, group, profile) * count
        if len(group) > 1 and not is_grad_sync(c, "step", mesh_shape):
            total += pricing.shared_core_time(profile, c.bytes, devices)
    return total


def send_time(w: Workload, c: int, profile: Profile) -> float:
    """Seconds for chunk c to send its output activation (per device) to chunk c + 1."""
    a, b = w.chunks[c].stage, w.chunks[c + 1].stage if c + 1 < len(w.chunks) else None
    if b is None or a == b:
        return 0.0
    place = placement(w.mesh_shape, profile)
    link = links.transfer_link(place(stage_start(w, a)), place(stage_start(w, b)), profile)
    return links.p2p_time(w.chunks[c].send_bytes, link)


def placement(mesh_shape: dict[str, int], profile: Profile):
    """Mesh device index -> the profile's device index (device i is on node i //
    devices_per_node): mesh order, except that each index of an axis placed across nodes
    (node) starts a node of its own."""
    across = [a for a in mesh_shape if axes.get(a).across_nodes and mesh_shape[a] > 1]
    if not across:
        return lambda i: i
    block = math.prod(mesh_shape.values()) // mesh_shape[across[0]]
    per = profile.device.devices_per_node
    span = -(-block // per) * per  # whole nodes per index
    return lambda i: (i // block) * span + i % block


def stage_start(w: Workload, stage: int) -> int:
    """The mesh-order index of stage `stage`'s first device."""
    axis = axes.stage_axis(w.mesh_shape)
    return mesh_lib.first_device(w.mesh_shape, {axis: stage} if axis else {})
