"""The zero-bubble schedules' event orders (Qi et al. 2024), each backward split into B (input
gradient, which the previous chunk waits for) and W (weight gradient, which nobody waits for,
so it fills what would be bubbles): ZB-H1 on 1F1B's placement, ZB-V on two chunks per stage
placed in a V. schedules.stage_events gives them with the others.
"""

from __future__ import annotations

Event = tuple[str, int, int]  # (kind, chunk, micro-batch), as in schedules


def h1_events(k: int, m: int) -> list[list[Event]]:
    """ZB-H1 (Qi et al. 2024, figure 3): stage s runs 1F1B's K-s warm-up forwards, then
    B, W, F per micro-batch, except that its first s weight gradients are deferred by s
    micro-batches (the last stage's into the warm-up bubble of the others, the rest into the
    drain). Stage s then holds at most K-s + s = K micro-batches, 1F1B's peak (stage 0's)."""
    out = []
    for s in range(k):
        warmup = min(k - s, m)
        events = [("F", s, i) for i in range(warmup)]
        f, w = warmup, 0
        for b in range(m):
            events.append(("B", s, b))
            if b >= s:
                events.append(("W", s, w))
                w += 1
            if f < m:
                events.append(("F", s, f))
                f += 1
        events += [("W", s, i) for i in range(w, m)]
        out.append(events)
    return out


def v_events(k: int, m: int) -> list[list[Event]]:
    """ZB-V (Qi et al., Pipeline Parallelism with Controllable Memory, 2024): the model in 2K
    chunks placed in a V, each backward split into B and W; micro-batches in groups of K.

    On a unit clock (F = B = W per chunk) stage s runs two lanes of one event every other
    tick. On ticks of s's parity: a group's K forwards of chunk s, then the K input gradients
    of chunk 2K-1-s, then their K weight gradients; on the others: the K forwards of chunk
    2K-1-s, the K input gradients of chunk s, their K weight gradients. Micro-batch i = gK + j
    starts at tick 6Kg + 2j, and its events follow at these offsets:

        F of chunk s  s         B of chunk 2K-1-s  2K + s      W of chunk 2K-1-s  4K + s
        F of 2K-1-s   2K-1-s    B of chunk s       4K-1-s      W of chunk s       6K-1-s

    Every F and B runs one tick after what it waits on, the lanes never meet, and from tick
    2K-1-s (the V's turn reaches stage s) both are full: a stage idles only on the ramp, K-1
    ticks, the fewest any schedule can (the last stage's first forward waits K-1 ticks). A
    stage holds at most one group's activations, K of each of its chunks (group g's weight
    gradients free them as group g+1 forwards): K micro-batches of whole stages, 1F1B's peak.

    With M = GK + q, 0 < q < K (runs refuse it, pipeline/checks.py; the micro-batch search may time
    it), the last group is short: it starts 2(K-q) ticks early, and the last K-q weight
    gradients of each lane of the group before wait 2q ticks, into the gaps the short group
    leaves before its input gradients. Still 2K activations, but up to K + min(q, K-q) of
    them of chunk s on the first stages, and the stage idles K-q more ticks; with M < K,
    3(K-M) more (no group to borrow from).
    The order is the ticks' order; schedules.timeline with equal times starts no event after its
    tick (some ramp forwards before), so its makespan is 6M + K-1 ticks when K divides M."""
    full, q = divmod(m, k)
    out = []
    for s in range(k):
        a, b = s, 2 * k - 1 - s
        ticks = []
        for i in range(m):
            g, j = divmod(i, k)
            t = 6 * k * g + 2 * j - (2 * (k - q) if g == full else 0)
            late = 2 * q if g == full - 1 and j >= q > 0 else 0
            ticks += [
                (t + s, ("F", a, i)),
                (t + 2 * k - 1 - s, ("F", b, i)),
                (t + 2 * k + s, ("B", b, i)),
                (t + 4 * k - 1 - s, ("B", a, i)),
                (t + late + 4 * k + s, ("W", b, i)),
                (t + late + 6 * k - 1 - s, ("W", a, i)),
            ]
        out.append([e for _, e in sorted(ticks)])
    return out
