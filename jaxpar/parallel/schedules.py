"""Pipeline schedules as data: the ordered (forward/backward, micro-batch) events of each stage.

A schedule is inspectable (print it, export it) and drives both the dispatcher and the
analysis: `timeline` places every event on a clock given per-stage durations, from which the
bubble (the fraction of stage-time spent idle) follows.
"""

from __future__ import annotations

import dataclasses

Event = tuple[str, int]  # ("F" or "B", micro-batch)


def stage_events(name: str, num_stages: int, num_microbatches: int) -> list[list[Event]]:
    """Per stage, its events in execution order.

    naive/gpipe: all forwards, then all backwards (naive is gpipe with one micro-batch).
    1f1b: stage s runs min(K-s-1, M) warm-up forwards, then alternates one forward and one
    backward, then drains the remaining backwards: at most K-s micro-batches in flight.
    """
    k, m = num_stages, num_microbatches
    out = []
    for s in range(k):
        if name in ("naive", "gpipe"):
            events = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
        elif name == "1f1b":
            warmup = min(k - s - 1, m)
            events = [("F", i) for i in range(warmup)]
            f, b = warmup, 0
            while b < m:
                if f < m:
                    events.append(("F", f))
                    f += 1
                events.append(("B", b))
                b += 1
        else:
            raise ValueError(f"unknown pipeline schedule {name!r}; use naive, gpipe or 1f1b")
        out.append(events)
    return out


def _ready(event: Event, stage: int, num_stages: int, done: set) -> bool:
    kind, i = event
    if kind == "F":
        return stage == 0 or ("F", stage - 1, i) in done
    if stage == num_stages - 1:
        return ("F", stage, i) in done
    return ("B", stage + 1, i) in done and ("F", stage, i) in done


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Start and end time of every event; the makespan and the idle fraction."""

    spans: dict[tuple[str, int, int], tuple[float, float]]  # (kind, stage, mb) -> (start, end)
    makespan: float
    busy: tuple[float, ...]  # per stage

    @property
    def bubble(self) -> float:
        """Idle stage-time over total stage-time: 1 - sum(busy) / (K * makespan)."""
        return 1.0 - sum(self.busy) / (len(self.busy) * self.makespan)


def timeline(
    events: list[list[Event]], fwd: list[float] | None = None, bwd: list[float] | None = None
) -> Timeline:
    """Place events on a clock: each starts when its stage is free and its inputs exist.

    Durations default to 1 (forward) and 2 (backward) per micro-batch, the usual FLOP ratio.
    """
    k = len(events)
    fwd = fwd or [1.0] * k
    bwd = bwd or [2.0] * k
    spans: dict = {}
    free = [0.0] * k
    pos = [0] * k
    total = sum(len(e) for e in events)
    while len(spans) < total:
        progressed = False
        for s in range(k):
            if pos[s] == len(events[s]):
                continue
            kind, i = events[s][pos[s]]
            deps = _deps(kind, s, i, k)
            if not all(d in spans for d in deps):
                continue
            start = max([free[s]] + [spans[d][1] for d in deps])
            end = start + (fwd[s] if kind == "F" else bwd[s])
            spans[(kind, s, i)] = (start, end)
            free[s], pos[s] = end, pos[s] + 1
            progressed = True
        if not progressed:
            raise ValueError("schedule deadlocks: an event waits on one that never runs")
    busy = tuple(
        sum(end - start for (kd, st, _), (start, end) in spans.items() if st == s) for s in range(k)
    )
    return Timeline(spans, max(end for _, end in spans.values()), busy)


def _deps(kind: str, s: int, i: int, k: int) -> list[tuple[str, int, int]]:
    if kind == "F":
        return [] if s == 0 else [("F", s - 1, i)]
    deps = [("F", s, i)]
    if s < k - 1:
        deps.append(("B", s + 1, i))
    return deps


def dispatch_order(events: list[list[Event]]) -> list[tuple[str, int, int]]:
    """A global order of (kind, stage, micro-batch) that respects every dependency: events
    sorted by their start time on the unit-cost timeline (ties by stage). The host dispatches
    in this order; each device then runs its own events in its stage's order."""
    spans = timeline(events).spans
    return sorted(spans, key=lambda e: (spans[e][0], e[1]))


def analytic_bubble(num_stages: int, num_microbatches: int) -> float:
    """GPipe's idle fraction with equal stages: (K - 1) / (M + K - 1)."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def in_flight(events: list[Event]) -> int:
    """Most micro-batches a stage holds activations for (forwarded, not yet backwarded)."""
    live = peak = 0
    for kind, _ in events:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def render(events: list[list[Event]]) -> str:
    """The schedule as text, one row per stage, e.g. 'stage 0: F0 F1 B0 F2 B1 B2'."""
    return "\n".join(
        f"stage {s}: " + " ".join(f"{k}{i}" for k, i in ev) for s, ev in enumerate(events)
    )
