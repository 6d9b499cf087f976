"""Why a predicted row is what it is, as the plan's report says it: what dominates its step
(`why`), what the predictor could not price (`unpriced`), and the command line that trains it
(`command`). (What a configuration will do, without predicting, is `--explain`:
jaxpar/explain.py.)
"""

from __future__ import annotations

import math
import shlex

from jaxpar import configfile
from jaxpar.plan.candidates import Candidate
from jaxpar.plan.records import PlanRow
from jaxpar.predict.comm import links


def unpriced(row: PlanRow) -> dict[str, int]:
    """Collectives the predictor could not place on mesh axes ("?"), which it would price at
    0 s. None today: groups come from replica groups, source-target pairs, or every device
    (tests/test_perfmodel.py); kept as a guard for collectives a future XLA prints otherwise."""
    cols = row.predicted.collective_bytes_per_device or {}
    total = sum(cols.values())  # a few kB of metrics among megabytes do not count
    return {k: v for k, v in cols.items() if k.endswith(" ?") and v > 0.01 * total}


def why(row: PlanRow, profile) -> str:
    """What dominates the predicted step, in a few words (and what the prediction leaves out)."""
    text = _why(row, profile)
    missing = unpriced(row)
    if missing:
        text += "; NOT priced: " + ", ".join(f"{k} {v / 1e6:,.1f} MB" for k, v in missing.items())
    return text


def _why(row: PlanRow, profile) -> str:
    p = row.predicted
    step = p.step_time_s
    parts = {
        "compute": p.compute_s or 0.0,
        "comm": p.comm_s or 0.0,
        "bubble": p.bubble_s or 0.0,
        "overhead": p.overhead_s or 0.0,
    }
    share = {k: v / step for k, v in parts.items()} if step else parts
    worst = max(("comm", "bubble", "overhead"), key=lambda k: share[k])
    if share["compute"] >= 0.8 or share[worst] < 0.05:
        return f"compute-bound: compute {100 * share['compute']:.0f}% of step"
    head = f"{worst} {100 * share[worst]:.0f}% of step"
    if worst == "comm":
        cols = p.collective_bytes_per_device or {}
        if not cols:
            return f"{head}: stage-boundary sends"
        priced = {k: v for k, v in cols.items() if k not in unpriced(row)} or cols
        on = {k: _link(row, profile, k) for k in priced}
        kind, nbytes = max(priced.items(), key=lambda kv: kv[1] / on[kv[0]][0])
        link, where = on[kind]
        calls = row.collective_calls_per_step or {}
        moved = sum(v / on[k][0] for k, v in priced.items())  # seconds at full bandwidth
        if calls and moved < 0.5 * p.comm_s:  # the per-call latency dominates
            top, n = max(calls.items(), key=lambda kv: kv[1])
            return (
                f"{head}: latency-bound, {sum(calls.values())} collective calls/step "
                f"(most: {top} x{n}) at {_latency(row, profile)}"
            )
        return f"{head}: {kind} {nbytes / 1e6:,.1f} MB/step over {where} ({link / 1e9:g} GB/s)"
    if worst == "bubble":
        c = row.candidate
        return f"{head}: {c.schedule} K={c.stages} M={c.microbatches}"
    return f"{head}: host dispatch of the step's programs"


def _latency(row: PlanRow, profile) -> str:
    """The fixed cost of a collective on the row's links: the latency per ring step, or where
    the library has a low-latency protocol (links.Link.protocols) that protocol's, the
    cheapest for a small message."""
    nodes = math.ceil((row.predicted.num_devices or 1) / max(profile.device.devices_per_node, 1))
    link = profile.links.inter if nodes > 1 else profile.links.intra
    own = f"{1e6 * link.latency:g} us per ring step"
    if not link.protocols:
        return own
    name, once, step, _ = min(link.protocols, key=lambda p: p[1] + p[2])
    return f"{1e6 * once:g} us + {1e6 * step:g} us per ring step ({name}; {own} otherwise)"


def _link(row: PlanRow, profile, collective: str = "") -> tuple[float, str]:
    """(bandwidth, where) of the links a collective ("kind axes", e.g. "all-gather data")
    runs on: the inter-node ones when its group of devices spans nodes (devices numbered in
    mesh order, `devices_per_node` to a node), else the intra-node ones."""
    per_node = max(profile.device.devices_per_node, 1)
    nodes = math.ceil((row.predicted.num_devices or 1) / per_node)
    names, sizes = row.predicted.mesh_axes or (), row.predicted.mesh_shape or ()
    group = collective.rpartition(" ")[2].split("+")
    if nodes > 1 and len(names) == len(sizes) and set(group) <= set(names):
        strides = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
        last = sum((n - 1) * st for a, n, st in zip(names, sizes, strides) if a in group)
        if last < per_node:  # the group's devices all sit in one node
            nodes = 1
    if nodes > 1:
        return profile.links.inter.ring_bandwidth, f"{nodes} nodes"
    if profile.links.peers is not None and set(group) <= set(names):
        ring = links.ring_link(links.group_of("+".join(group), dict(zip(names, sizes))), profile)
        if ring is not profile.links.intra:  # a hop between devices not wired to each other
            return ring.ring_bandwidth, "an unwired hop (through the hosts)"
    return profile.links.intra.ring_bandwidth, "intra-node links"


def command(
    config_file: str, row_or_candidate: PlanRow | Candidate, config=None, extra: dict | None = None
) -> str:
    """The `python -m jaxpar.train` command line that runs a candidate."""
    c = row_or_candidate.candidate if isinstance(row_or_candidate, PlanRow) else row_or_candidate
    args = ["python", "-m", "jaxpar.train", "--config", config_file]
    settings = {**(extra or {}), **c.overrides(config)}
    args += configfile.override_args(settings)
    return " ".join(shlex.quote(a) for a in args)
