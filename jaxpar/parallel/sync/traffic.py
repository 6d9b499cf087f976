"""Who sends what to whom, read from a compiled program's HLO text (beyond `jaxpar.hlo`'s
per-collective totals): collective-permute bytes per device, and collectives that sit in a
conditional branch (run only when the branch is taken, e.g. local_sgd's average)."""

from __future__ import annotations

import re

from jaxpar import hlo

_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")


def permute_bytes(hlo_text: str, n: int) -> tuple[list[int], list[int]]:
    """(sent, received) bytes per device over every collective-permute in the program."""
    sent, received = [0] * n, [0] * n
    for line in hlo_text.splitlines():
        found = hlo.collectives(line)
        if not found or found[0].kind != "collective-permute":
            continue
        pairs = _PAIRS.search(line)
        for src, dst in re.findall(r"\{(\d+),(\d+)\}", pairs.group(1) if pairs else ""):
            sent[int(src)] += found[0].bytes
            received[int(dst)] += found[0].bytes
    return sent, received


def conditional_collectives(hlo_text: str) -> int:
    """How many collectives lie in computations called only from a conditional's branches."""
    lines = hlo_text.splitlines()
    return sum(1 for i in hlo.branch_lines(hlo_text) if hlo.collectives(lines[i]))


def bytes_per_step(hlo_text: str, n: int, period: int = 1) -> list[int]:
    """Bytes each device receives per step, by `jaxpar.hlo`'s measure (a collective's result
    bytes per device): collective-permutes count only at their targets, and collectives in a
    conditional branch (local_sgd's average) count 1/period."""
    lines = hlo_text.splitlines()
    branch = hlo.branch_lines(hlo_text)
    _, received = permute_bytes(hlo_text, n)
    per_device = [float(r) for r in received]
    for i, line in enumerate(lines):
        for c in hlo.collectives(line):
            if c.kind == "collective-permute":
                continue
            share = c.bytes / period if i in branch else c.bytes
            per_device = [b + share for b in per_device]
    return [round(b) for b in per_device]
