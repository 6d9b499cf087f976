"""Pipeline schedules as data: the ordered (kind, chunk, micro-batch) events of each stage.

A schedule is inspectable (print it, export it) and drives both the dispatcher and the
analysis: `timeline` places every event on a clock given per-chunk durations, from which the
bubble (the fraction of stage-time spent idle) follows.

Kinds: "F" forward; "B" backward (the whole backward, or with zero-bubble schedules only the
input gradient, which the previous chunk waits for); "W" weight gradient (zero-bubble only:
nobody waits for it, so it fills what would be bubbles). The model is cut into chunks; device
stage d holds chunks d, d + K, ..., d + (v-1)K (v = virtual stages, 1 unless interleaved),
except under ZB-V, where it holds chunks d and 2K-1-d (`placement`).
"""

from __future__ import annotations

import dataclasses

from jaxpar.parallel import zero_bubble

Event = tuple[str, int, int]  # (kind, chunk, micro-batch)
NAMES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")


def calls_per_step(phase: str, num_microbatches: int) -> int:
    """How often a program of `phase` runs in one training step: once for a whole step
    ("step") or a stage's optimizer update ("update"), once per micro-batch for the others
    (forward, backward and its halves)."""
    return 1 if phase in ("step", "update", "combine", "apply_update") else num_microbatches


def placement(name: str, num_stages: int, virtual_stages: int = 1) -> tuple[int, ...]:
    """The device stage of each chunk: c mod K (v chunks per stage under interleaved, one
    otherwise), or ZB-V's V: chunks 0..K-1 down the stages, K..2K-1 back up, so that stage d
    holds chunks d and 2K-1-d and the first and last chunks share stage 0."""
    k = num_stages
    if name == "zb-v":
        return tuple(c if c < k else 2 * k - 1 - c for c in range(2 * k))
    v = virtual_stages if name == "interleaved" else 1
    return tuple(c % k for c in range(k * v))


def stage_events(
    name: str, num_stages: int, num_microbatches: int, virtual_stages: int = 1
) -> list[list[Event]]:
    """Per device stage, its events in execution order.

    naive/gpipe: all forwards, then all backwards (naive is gpipe with one micro-batch).
    1f1b: stage s runs min(K-s-1, M) warm-up forwards, then alternates one forward and one
    backward, then drains the remaining backwards: at most K-s micro-batches in flight.
    interleaved: Megatron's interleaved 1F1B over v chunks per stage (M a multiple of K).
    zb-h1: 1F1B's forwards and input-gradient backwards, each weight gradient delayed into
    idle time while at most K-s micro-batches are in flight (forwarded, W not yet done).
    zb-v: two chunks per stage in a V (`placement`), F/B/W as zero-bubble (zero_bubble.py).
    """
    k, m, v = num_stages, num_microbatches, virtual_stages
    if name == "zb-h1":
        return zero_bubble.h1_events(k, m)
    if name == "zb-v":
        return zero_bubble.v_events(k, m)
    if name == "interleaved" and v > 1:
        return [_interleaved(k, m, v, s) for s in range(k)]
    if name not in NAMES:
        raise ValueError(f"unknown pipeline schedule {name!r}; use one of {', '.join(NAMES)}")
    out = []
    for s in range(k):
        if name in ("naive", "gpipe"):
            events = [("F", s, i) for i in range(m)] + [("B", s, i) for i in range(m)]
        else:  # 1f1b, and interleaved with one chunk per stage
            warmup = min(k - s - 1, m)
            events = [("F", s, i) for i in range(warmup)]
            f, b = warmup, 0
            while b < m:
                if f < m:
                    events.append(("F", s, f))
                    f += 1
                events.append(("B", s, b))
                b += 1
        out.append(events)
    return out


def _interleaved(k: int, m: int, v: int, s: int) -> list[Event]:
    """Megatron-LM's interleaved order for device stage s: micro-batches in groups of K, each
    group through chunk 0..v-1 forward and v-1..0 backward; warm-up 2(K-s-1) + (v-1)K."""
    total = m * v

    def at(j: int, forward: bool) -> tuple[int, int]:
        local = (j // k) % v
        chunk = (local if forward else v - 1 - local) * k + s
        return chunk, (j // (k * v)) * k + j % k

    warmup = min(2 * (k - s - 1) + (v - 1) * k, total)
    events = [("F", *at(j, True)) for j in range(warmup)]
    for j in range(total - warmup):
        events.append(("F", *at(warmup + j, True)))
        events.append(("B", *at(j, False)))
    events += [("B", *at(j, False)) for j in range(total - warmup, total)]
    return events


def _deps(event: Event, num_chunks: int) -> list[Event]:
    kind, c, i = event
    if kind == "F":
        return [] if c == 0 else [("F", c - 1, i)]
    if kind == "W":
        return [("B", c, i)]
    return [("F", c, i)] + ([("B", c + 1, i)] if c < num_chunks - 1 else [])


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Start and end time of every event; the makespan and the idle fraction."""

    spans: dict[Event, tuple[float, float]]  # (kind, chunk, mb) -> (start, end)
    makespan: float
    busy: tuple[float, ...]  # per device stage

    @property
    def bubble(self) -> float:
        """Idle stage-time over total stage-time: 1 - sum(busy) / (K * makespan)."""
        return 1.0 - sum(self.busy) / (len(self.busy) * self.makespan)


def num_chunks(events: list[list[Event]]) -> int:
    return 1 + max(c for stage in events for _, c, _ in stage)


def split_backward(events: list[list[Event]]) -> bool:
    """Whether the schedule splits each backward into B (input gradient) and W (weights)."""
    return any(kind == "W" for stage in events for kind, _, _ in stage)


def timeline(
    events: list[list[Event]],
    fwd: list[float] | None = None,
    bwd: list[float] | None = None,
    wgt: list[float] | None = None,
) -> Timeline:
    """Place events on a clock: each starts when its stage is free and its inputs exist.

    Durations are per chunk (per stage when v = 1): forward, input-gradient backward and
    weight-gradient backward; a schedule without W events runs B as one backward costing
    bwd + wgt. Defaults: 1 each per stage (split over its chunks), the usual FLOP ratio.
    """
    k, c = len(events), num_chunks(events)
    share = k / c
    fwd = fwd or [share] * c
    if wgt is None:
        wgt = [share] * c if (bwd is None or split_backward(events)) else [0.0] * c
    bwd = bwd or [share] * c
    cost = {"F": fwd, "B": bwd, "W": wgt}
    if not split_backward(events):
        cost["B"] = [b + w for b, w in zip(bwd, wgt)]
    spans: dict = {}
    free = [0.0] * k
    pos = [0] * k
    total = sum(len(e) for e in events)
    while len(spans) < total:
        progressed = False
        for s in range(k):
            if pos[s] == len(events[s]):
                continue
            event = events[s][pos[s]]
            deps = _deps(event, c)
            if not all(d in spans for d in deps):
                continue
            start = max([free[s]] + [spans[d][1] for d in deps])
            end = start + cost[event[0]][event[1]]
            spans[event] = (start, end)
            free[s], pos[s] = end, pos[s] + 1
            progressed = True
        if not progressed:
            raise ValueError("schedule deadlocks: an event waits on one that never runs")
    busy = tuple(sum(spans[e][1] - spans[e][0] for e in events[s]) for s in range(k))
    return Timeline(spans, max(end for _, end in spans.values()), busy)


def dispatch_order(events: list[list[Event]]) -> list[Event]:
    """A global order of (kind, chunk, micro-batch) that respects every dependency: events
    sorted by their start time on the unit-cost timeline (ties by stage). The host dispatches
    in this order; each device then runs its own events in its stage's order."""
    stage = {e: s for s, mine in enumerate(events) for e in mine}
    spans = timeline(events).spans
    return sorted(spans, key=lambda e: (spans[e][0], stage[e]))


def analytic_bubble(
    num_stages: int, num_microbatches: int, schedule: str = "gpipe", virtual_stages: int = 1
) -> float:
    """Idle fraction with equal stages (F = B = W): (K-1)/(M+K-1) for GPipe and 1F1B,
    (K-1)/(vM+K-1) interleaved, (K-1)/(3M+K-1) for ZB-H1 when M >= K (a third of 1F1B's
    idle time; with fewer micro-batches than stages the W passes cannot fill the ramp), and
    (K-1+r)/(6M+K-1+r) for ZB-V, r = (-M) mod K when M >= K: (K-1)/(6M+K-1) when K divides
    M, half of ZB-H1's idle time and the least possible; a short last group of micro-batches
    idles r ticks more, at most ZB-H1's bubble (r = K-1). With M < K, r = 3(K-M)."""
    k, m = num_stages, num_microbatches
    if schedule == "zb-h1":
        return 1 - 3 * m / (max(3 * m, 2 * m + k) + k - 1)
    if schedule == "zb-v":  # per stage 6M chunk events, K-1+r idle ticks (zero_bubble.py)
        r = -m % k if m >= k else 3 * (k - m)
        return (k - 1 + r) / (6 * m + k - 1 + r)
    if schedule == "interleaved":
        m *= virtual_stages
    return (k - 1) / (m + k - 1)


def in_flight(events: list[Event]) -> int:
    """Most micro-batches a stage holds activations for (forwarded, backward not finished:
    W done when the schedule splits it, else B)."""
    split = any(kind == "W" for kind, _, _ in events)
    live = peak = 0
    for kind, _, _ in events:
        live += 1 if kind == "F" else -1 if kind == ("W" if split else "B") else 0
        peak = max(peak, live)
    return peak


def render(events: list[list[Event]]) -> str:
    """The schedule as text, one row per stage, e.g. 'stage 0: F0 F1 B0 F2 B1 B2'; with
    several chunks per stage the chunk follows a dot: 'F0.4' is micro-batch 0 in chunk 4."""
    chunks = num_chunks(events) > len(events)
    return "\n".join(
        f"stage {s}: " + " ".join(f"{k}{i}.{c}" if chunks else f"{k}{i}" for k, c, i in ev)
        for s, ev in enumerate(events)
    )


FORMULAS = {
    "naive": "(K-1)/(M+K-1)",
    "gpipe": "(K-1)/(M+K-1)",
    "1f1b": "(K-1)/(M+K-1)",
    "interleaved": "(K-1)/(vM+K-1)",
    "zb-h1": "(K-1)/(3M+K-1), M >= K",
    "zb-v": "(K-1+r)/(6M+K-1+r), r = -M mod K, M >= K",
}


def bubble_formula(name: str) -> str:
    """The schedule's analytic bubble as a formula, with equal stages (F = B = W)."""
    return FORMULAS.get(name, "timeline with equal stages")
