"""Read a compiled program's HLO text: `reader` parses it once into computations and
instructions with their shapes (`parse`, `Program`, `Instruction`, `dims`, `elements`,
`shape_bytes`, ...); here, on top of it, the collectives the program performs.

Figures here are exact and machine-independent: they come from the program XLA will run, not
from timing. Bytes are those of each collective's result per device per call.
"""

from __future__ import annotations

import dataclasses

from jaxpar.hlo.reader import (
    DTYPE_BYTES,
    Instruction,
    Program,
    arrays,
    callees,
    dims,
    elements,
    largest_elements,
    minor_dim,
    modules,
    operands,
    parse,
    replica_groups,
    shape_bytes,
)

__all__ = [
    "DTYPE_BYTES",
    "KINDS",
    "Collective",
    "Instruction",
    "Program",
    "arrays",
    "callees",
    "collective",
    "collectives",
    "count_ops",
    "dims",
    "elements",
    "largest_elements",
    "minor_dim",
    "modules",
    "operands",
    "parse",
    "replica_groups",
    "shape_bytes",
]

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    bytes: int  # result bytes per device
    groups: str  # replica groups as printed by XLA (a permute's source-target pairs)
    in_branch: bool = False  # in a conditional's branch: runs only when it is taken
    pairs: tuple[tuple[int, int], ...] = ()  # a permute's (source, target) devices


def collective(ins: Instruction, in_branch: bool = False) -> Collective | None:
    """The collective an instruction performs (an async pair at its start), else None."""
    kind = ins.opcode.removesuffix("-start")
    if kind not in KINDS or ins.opcode.endswith("-done"):
        return None
    result_type = ins.type
    if ins.opcode.endswith("-start") and kind != "all-reduce":
        # async start of a gather/permute returns (operands, results, ...): keep results
        parts = _top_level(result_type)
        result_type = parts[1] if len(parts) > 1 else result_type
    return Collective(
        kind,
        shape_bytes(result_type),
        ins.replica_groups(),
        in_branch,
        ins.source_target_pairs(),
    )


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective op in the program, in the text's order (async pairs counted once, at
    their start), each marked where it lies in a conditional's branch."""
    found = []
    for text in modules(hlo_text):  # programs joined into one text: each read apart
        program = parse(text)
        branches = program.branch_computations
        found += [collective(ins, comp in branches) for comp, ins in program.instructions()]
    return [c for c in found if c is not None]


def _top_level(type_text: str) -> list[str]:
    """Split "((a, b), c, d)" into its top-level elements ["(a, b)", "c", "d"]."""
    text = type_text.strip()
    if not text.startswith("("):
        return [text]
    parts, depth, start = [], 0, 1
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 1:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:-1].strip())
    return parts


def count_ops(hlo_text: str, opcode: str) -> int:
    """How many `opcode` instructions (e.g. "convolution") the program holds, fused
    computations included: what a program computes, independent of timing."""
    return sum(
        ins.opcode == opcode for text in modules(hlo_text) for _, ins in parse(text).instructions()
    )
