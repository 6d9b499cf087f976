"""When a collective can run under a program's compute, read from the compiled program.

For every collective of a program's entry computation, and for each element of a combined one
(XLA joins many gradients' all-reduces into one of a tuple), where it stands in the program:

- `ready`: the share of the program's matrix FLOPs done, in the program's order, when its
  operand has been computed (a gradient of the last layer is ready early in the backward, the
  first layer's at its end);
- `between`: for an asynchronous pair (`all-reduce-start` ... `all-reduce-done`, likewise for
  the other kinds), the share of FLOPs the program schedules between the start and the done:
  what runs under it. None for a synchronous collective.

How the predictor uses them (jaxpar/predict/step/model.py): a program with asynchronous pairs hides
each collective under the work between its start and its done (exact for that program);
XLA:CPU runs collectives synchronously and emits none, so on this machine nothing hides, as
jaxpar's step measures. For a GPU target (`overlap = None` in the profile: "as the compiler
schedules") every collective is asynchronous and XLA's latency-hiding scheduler starts it once
its operand is ready: the gradients go over the link one after another from their `ready`
points, and only what is still running when the compute ends is exposed. FLOP shares stand in
for time shares.
"""

from __future__ import annotations

import dataclasses

from jaxpar import collectives, hlo
from jaxpar.predict.kernels import opclass


@dataclasses.dataclass(frozen=True)
class Window:
    kind: str
    axes: str  # mesh axes of its group ("data", "data+tensor", ...)
    bytes: int  # result bytes per device (one element of a combined collective)
    ready: float  # share of the program's matrix FLOPs done when its operand is ready
    between: float | None  # async pair: share of FLOPs between its start and its done
    # bytes of the whole collective this element belongs to (a combined one's elements share
    # its one latency); None: the element is a collective of its own
    whole: int | None = None


def windows(text: str, mesh_shape: dict[str, int]) -> tuple[Window, ...]:
    """Every collective of the program's entry computation, element by element."""
    program = hlo.parse(text)
    types = program.types
    done_flops, position, producer = [], {}, {}
    total = 0.0
    for i, ins in enumerate(program.entry):
        position[ins.name] = i
        if ins.opcode in ("get-tuple-element", "bitcast") and ins.operands:
            producer[ins.name] = producer.get(ins.operands[0], ins.operands[0])
        total += sum(m.flops for m in opclass.matmuls_of(ins, program))
        done_flops.append(total)
    total = total or 1.0
    starts = {}
    out = []
    for ins in program.entry:
        args = ins.operands
        if ins.opcode.endswith("-done"):
            if args and args[0] in starts:
                s = starts.pop(args[0])
                between = (done_flops[position[ins.name]] - done_flops[position[args[0]]]) / total
                out[s] = [dataclasses.replace(w, between=between) for w in out[s]]
            continue
        c = hlo.collective(ins)
        if c is None:
            continue
        axes = collectives.collective_axes(c, mesh_shape)
        elements = []
        whole = sum(hlo.shape_bytes(types.get(arg, "")) for arg in args)
        for arg in args:
            src = producer.get(arg, arg)
            at = position.get(src, 0)
            elements.append(
                Window(
                    c.kind,
                    axes,
                    hlo.shape_bytes(types.get(arg, "")),
                    done_flops[at] / total if src in position else 0.0,
                    None,
                    whole if len(args) > 1 else None,
                )
            )
        if ins.opcode.endswith("-start"):
            starts[ins.name] = len(out)
        out.append(elements)
    return tuple(w for group in out for w in group)


def exposed(times: list[float], ready: list[float], compute: float) -> float:
    """Seconds of communication left after `compute` when transfer i (taking times[i]) may
    start at ready[i] x compute and the link carries one at a time, in order of readiness."""
    link = 0.0
    for t, r in sorted(zip(times, ready), key=lambda p: p[1]):
        link = max(link, r * compute) + t
    return max(0.0, link - compute)
