"""Read the collectives a compiled program performs from its HLO text.

Figures here are exact and machine-independent: they come from the program XLA will run, not
from timing. Bytes are those of each collective's result per device per call.
"""

from __future__ import annotations

import dataclasses
import math
import re

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
}
_OP = re.compile(r"=\s*(.+?)\s+(" + "|".join(KINDS) + r")(-start)?\(")
_SHAPE = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_GROUPS = re.compile(
    r"replica_groups=(mesh\[[^\]]*\]\s*\{[^}]*\}|\{[\d,{}]*\}|\[[^\s]*\][^\s,]*)"
    r"|source_target_pairs=(\{[\d,{}]*\})"
)


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    bytes: int  # result bytes per device
    groups: str  # replica groups as printed by XLA (a permute's source-target pairs)


def shape_bytes(type_text: str) -> int:
    """Total bytes of every array shape in an HLO type such as "(f32[8], f32[3,3])"."""
    total = 0
    for dtype, dims in _SHAPE.findall(type_text):
        size = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += size * _DTYPE_BYTES[dtype]
    return total


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective op in the program (async pairs counted once, at their start)."""
    found = []
    for line in hlo_text.splitlines():
        match = _OP.search(line)
        if not match:
            continue
        result_type, kind = match.group(1), match.group(2)
        if match.group(3) and kind != "all-reduce":
            # async start of a gather/permute returns (operands, results, ...): keep results
            parts = _top_level(result_type)
            result_type = parts[1] if len(parts) > 1 else result_type
        groups = _GROUPS.search(line)
        text = (groups.group(1) or groups.group(2)) if groups else ""
        found.append(Collective(kind, shape_bytes(result_type), text))
    return found


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
    """How many `opcode` instructions (e.g. "convolution") the program text holds, fused
    computations included: what a program computes, independent of timing."""
    return len(re.findall(rf"\s{re.escape(opcode)}\(", hlo_text))


def branch_lines(hlo_text: str) -> set[int]:
    """Line numbers of the instructions in computations that are conditional branches."""
    lines = hlo_text.splitlines()
    branches: set[str] = set()
    for line in lines:
        if " conditional(" in line:
            for key in ("true_computation", "false_computation"):
                m = re.search(key + r"=(%?[\w.\-]+)", line)
                if m:
                    branches.add(m.group(1).lstrip("%"))
            m = re.search(r"branch_computations=\{([^}]*)\}", line)
            if m:
                branches |= {b.strip().lstrip("%") for b in m.group(1).split(",")}
    inside, current = set(), None
    for i, line in enumerate(lines):
        head = re.match(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head:
            current = head.group(1)
        elif current in branches:
            inside.add(i)
    return inside
