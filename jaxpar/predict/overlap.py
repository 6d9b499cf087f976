"""When a collective can run under a program's compute, read from the compiled program.

For every collective of a program's entry computation, and for each element of a combined one
(XLA joins many gradients' all-reduces into one of a tuple), where it stands in the program:

- `ready`: the share of the program's matrix FLOPs done, in the program's order, when its
  operand has been computed (a gradient of the last layer is ready early in the backward, the
  first layer's at its end);
- `between`: for an asynchronous pair (`all-reduce-start` ... `all-reduce-done`, likewise for
  the other kinds), the share of FLOPs the program schedules between the start and the done:
  what runs under it. None for a synchronous collective.

How the predictor uses them (jaxpar/predict/model.py): a program with asynchronous pairs hides
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
from jaxpar.predict import opclass


@dataclasses.dataclass(frozen=True)
class Window:
    kind: str
    axes: str  # mesh axes of its group ("data", "data+tensor", ...)
    bytes: int  # result bytes per device (one element of a combined collective)
    ready: float  # share of the program's matrix FLOPs done when its operand is ready
    between: float | None  # async pair: share of FLOPs between its start and its done


def windows(text: str, mesh_shape: dict[str, int]) -> tuple[Window, ...]:
    """Every collective of the program's entry computation, element by element."""
    comps = opclass._computations(text)
    types = {name: result for body in comps.values() for name, result, _, _ in body}
    entry = comps.get("ENTRY", [])
    done_flops, position, producer = [], {}, {}
    total = 0.0
    for i, (name, result, op, rest) in enumerate(entry):
        position[name] = i
        args = opclass._operands(rest)
        if op in ("get-tuple-element", "bitcast") and args:
            producer[name] = producer.get(args[0], args[0])
        total += _flops(op, result, rest, comps, types)
        done_flops.append(total)
    total = total or 1.0
    lines = {name: f"%{name} = {result} {op}({rest}" for name, result, op, rest in entry}
    starts = {}
    out = []
    for name, result, op, rest in entry:
        kind = op.removesuffix("-start")
        if op.endswith("-done"):
            args = opclass._operands(rest)
            if args and args[0] in starts:
                s = starts.pop(args[0])
                between = (done_flops[position[name]] - done_flops[position[args[0]]]) / total
                out[s] = [dataclasses.replace(w, between=between) for w in out[s]]
            continue
        if kind not in hlo.KINDS:
            continue
        axes = _axes(lines[name], mesh_shape)
        elements = []
        for arg in opclass._operands(rest):
            src = producer.get(arg, arg)
            at = position.get(src, 0)
            elements.append(
                Window(
                    kind,
                    axes,
                    hlo.shape_bytes(types.get(arg, "")),
                    done_flops[at] / total if src in position else 0.0,
                    None,
                )
            )
        if op.endswith("-start"):
            starts[name] = len(out)
        out.append(elements)
    return tuple(w for group in out for w in group)


def _flops(op: str, result: str, rest: str, comps: dict, types: dict) -> float:
    if op in ("convolution", "dot"):
        return opclass._matmul(op, result, rest, types).flops
    if op != "fusion":
        return 0.0
    total = 0.0
    for callee in opclass._called(rest):
        for _, r, inner, inner_rest in comps.get(callee, ()):
            total += _flops(inner, r, inner_rest, comps, types)
    return total


def _axes(line: str, mesh_shape: dict[str, int]) -> str:
    """The mesh axes a collective's groups vary along (collectives. reading of one line)."""
    placed = collectives._placed(line, mesh_shape)
    return placed[0][1] if placed else "none"


def exposed(times: list[float], ready: list[float], compute: float) -> float:
    """Seconds of communication left after `compute` when transfer i (taking times[i]) may
    start at ready[i] x compute and the link carries one at a time, in order of readiness."""
    link = 0.0
    for t, r in sorted(zip(times, ready), key=lambda p: p[1]):
        link = max(link, r * compute) + t
    return max(0.0, link - compute)
