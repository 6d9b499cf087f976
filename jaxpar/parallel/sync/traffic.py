"""Who sends what to whom, read from a compiled program (beyond `jaxpar.hlo`'s per-collective
totals): collective-permute bytes per device, and collectives that sit in a conditional branch
(run only when the branch is taken, e.g. local_sgd's average)."""

from __future__ import annotations

from jaxpar import hlo


def permute_bytes(hlo_text: str, n: int) -> tuple[list[int], list[int]]:
    """(sent, received) bytes per device over every collective-permute in the program."""
    sent, received = [0] * n, [0] * n
    for c in hlo.collectives(hlo_text):
        if c.kind != "collective-permute":
            continue
        for src, dst in c.pairs:
            sent[src] += c.bytes
            received[dst] += c.bytes
    return sent, received


def conditional_collectives(hlo_text: str) -> int:
    """How many collectives lie in computations called only from a conditional's branches."""
    return sum(c.in_branch for c in hlo.collectives(hlo_text))


def bytes_per_step(hlo_text: str, n: int, period: int = 1) -> list[int]:
    """Bytes each device receives per step, by `jaxpar.hlo`'s measure (a collective's result
    bytes per device): collective-permutes count only at their targets, and collectives in a
    conditional branch (local_sgd's average) count 1/period."""
    _, received = permute_bytes(hlo_text, n)
    per_device = [float(r) for r in received]
    for c in hlo.collectives(hlo_text):
        if c.kind == "collective-permute":
            continue
        share = c.bytes / period if c.in_branch else c.bytes
        per_device = [b + share for b in per_device]
    return [round(b) for b in per_device]
