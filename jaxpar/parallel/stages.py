"""Cut a model's ordered layers into K contiguous pipeline stages, and describe the cut.

Policies (`pipeline.split`):
- "flops": minimise the largest stage's compute. Right where time follows FLOPs (large
  convolutions on GPUs), and the default: it needs no measurement.
- "time": minimise the slowest stage's measured time per micro-batch, its sends included
  (pipeline/balance.py times each layer on the run's devices first). Right where FLOPs are not
  time: thin early layers on CPUs, memory-bound layers, heterogeneous blocks.
- "params": minimise the largest stage's parameters: where memory for the state binds.
- "uniform": equal layer counts; for layers of equal cost (a stack of identical blocks).
- explicit cut points: a tuple of the K-1 layers where stages 1..K-1 begin, by index or
  by name (("layers_3", "layers_6") for a user's nn.Sequential).
VGG's FLOPs sit in its early, high-resolution layers and its parameters in its late, wide
ones, so the balances differ.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from jaxpar.errors import ConfigError
from jaxpar.models import SequentialModel

POLICIES = ("uniform", "flops", "params", "time")


class SplitError(ConfigError):
    """A stage split that does not cover every layer exactly once."""


def _balanced(
    costs: Sequence[float], k: int, boundary: Sequence[float] | None = None
) -> tuple[int, ...]:
    """Cut points (K+1 of them, from 0 to L) minimising the largest stage cost (exact DP).
    A stage [p, i) costs the sum of its layers' costs plus `boundary[i-1]` when it ends
    before the last layer (what sending its output costs)."""
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    send = [0] * n if boundary is None else [*boundary[:-1], 0]
    inf = float("inf")
    # best[j][i]: smallest max-stage cost splitting layers [0, i) into j stages.
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            for p in range(j - 1, i):
                cost = max(best[j - 1][p], prefix[i] - prefix[p] + send[i - 1])
                # ties: prefer the later cut, which keeps earlier stages lighter
                if cost < best[j][i] or (cost == best[j][i] and p > cut[j][i]):
                    best[j][i], cut[j][i] = cost, p
    bounds, i = [n], n
    for j in range(k, 0, -1):
        i = cut[j][i]
        bounds.append(i)
    return tuple(reversed(bounds))


def parse(value) -> str | tuple[int, ...]:
    """`pipeline.split` as a policy name or a tuple of cut points. Accepts what config files
    and the command line give: "flops", (4, 8, 12), 8 (one cut), or the text "(4,8,12)"."""
    original = value
    if isinstance(value, str):
        if value in POLICIES:
            return value
        text = value.strip().strip("()[]").replace(" ", "")
        points = tuple(b.strip("'\"") for b in text.split(",") if b)
        value = tuple(int(b) if b.lstrip("-").isdigit() else b for b in points)
        if not value or (len(value) == 1 and not text.endswith(",") and value[0] == text):
            raise SplitError(
                f"unknown pipeline.split {original!r}; use "
                f"{', '.join(POLICIES)} or the layers where stages 1..K-1 begin (indices or "
                "names), e.g. --config.pipeline.split='(4,8,12)'"
            )
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (tuple, list)) and value and all(_is_point(b) for b in value):
        return tuple(value)
    raise SplitError(
        f"pipeline.split must be {', '.join(POLICIES)} or a tuple of the layers where "
        f"stages 1..K-1 begin (indices or names), e.g. (4, 8, 12); got {original!r}"
    )


def _is_point(b) -> bool:
    """A cut point: a layer's index or its name."""
    return isinstance(b, str) or (isinstance(b, int) and not isinstance(b, bool))


def split(model: SequentialModel, num_stages: int, policy) -> tuple[int, ...]:
    """Stage boundaries (b_0=0 < b_1 < ... < b_K = L): stage s runs layers [b_s, b_{s+1})."""
    policy = parse(policy)
    n = len(model.layers)
    if num_stages > 1 and model.uncuttable:
        raise SplitError(model.uncuttable)
    if not 1 <= num_stages <= n:
        raise SplitError(
            f"{num_stages} stages but {model.name} has {n} layers; use 1 to {n} stages"
        )
    if isinstance(policy, str):
        if policy == "uniform":
            base, extra = divmod(n, num_stages)
            sizes = [base + (s < extra) for s in range(num_stages)]
            bounds = [0]
            for size in sizes:
                bounds.append(bounds[-1] + size)
            return tuple(bounds)
        if policy in ("flops", "params"):
            return _balanced([getattr(layer, policy) for layer in model.layers], num_stages)
        if policy == "time":
            if model.times is None:
                raise SplitError(
                    "pipeline.split=time needs the layers' measured times, which a training "
                    "run (jaxpar.train, the bench) measures first; use flops here"
                )
            times = model.times
            return _balanced(times.layer_costs(), num_stages, times.boundary_costs())
    bounds = (0, *(_index(model, b) for b in policy), n)
    check(bounds, n, num_stages)
    return bounds


def _index(model: SequentialModel, point) -> int:
    """A cut point's layer index (a name is looked up among the model's layers)."""
    if isinstance(point, int):
        return point
    names = [layer.name for layer in model.layers]
    if point not in names:
        raise SplitError(
            f"pipeline.split cuts at {point!r}, which is no layer of {model.name}; its layers "
            f"are {', '.join(names)}"
        )
    return names.index(point)


def check(bounds: Sequence[int], num_layers: int, num_stages: int) -> None:
    """Every layer in exactly one stage, stages contiguous and non-empty."""
    if len(bounds) != num_stages + 1:
        raise SplitError(
            f"pipeline.split needs {num_stages - 1} cut point{'s' if num_stages > 2 else ''} for {num_stages} stages (the "
            f"layer indices where stages 1..{num_stages - 1} begin), got {len(bounds) - 2}: "
            f"{tuple(bounds[1:-1])}"
        )
    if bounds[0] != 0 or bounds[-1] != num_layers:
        raise SplitError(
            f"pipeline.split cut points {tuple(bounds[1:-1])} must lie within 1..{num_layers - 1}"
            f" (the model has {num_layers} layers)"
        )
    if any(b >= a for b, a in itertools.pairwise(bounds)):
        raise SplitError(
            f"pipeline.split cut points {tuple(bounds[1:-1])} must increase strictly within "
            f"1..{num_layers - 1} so that no stage is empty"
        )


def stage_table(
    model: SequentialModel,
    bounds: Sequence[int],
    batch_size: int,
    stage_of: Sequence[int] | None = None,
    sent: Sequence[int] | None = None,
) -> str:
    """Per stage: layers, parameters, forward GFLOPs per batch, and the stage-to-stage bytes
    per step across the boundary after it, in MiB: its activations forward and their gradients
    back, for the whole global batch of `batch_size` (`sent`, per chunk, as the pipeline
    carries them; by default float32). The column sums to the summary's and `--explain`'s
    stage-to-stage bytes / step. With more chunks than device stages (interleaved, V-shaped
    schedules) one row per chunk, with the device stage `stage_of[c]` that holds it. With
    measured layer times (split=time) also each chunk's predicted milliseconds per
    micro-batch, sends included."""
    chunked = stage_of is not None and len(set(stage_of)) < len(bounds) - 1
    ms = model.times.chunk_times(bounds) if model.times is not None else None
    if sent is None:
        sent = [
            0
            if b == len(model.layers)
            else 2 * 4 * model.layers[b - 1].activation_size * batch_size
            for b in bounds[1:]
        ]
    head = f"{'chunk':>5} {'stage':>5}" if chunked else f"{'stage':>5}"
    rows = [
        f"{head} {'layers':<16} {'params':>12} {'GFLOPs/batch':>13} {'to next, MiB/step':>18}"
        + (f" {'ms/micro-batch':>15}" if ms else "")
    ]
    for s, (a, b) in enumerate(itertools.pairwise(bounds)):
        layers = model.layers[a:b]
        names = layers[0].name if len(layers) == 1 else f"{layers[0].name}-{layers[-1].name}"
        where = f"{s:>5} {stage_of[s]:>5}" if chunked else f"{s:>5}"
        rows.append(
            f"{where} {names:<16} {sum(x.params for x in layers):>12,} "
            f"{sum(x.flops for x in layers) * batch_size / 1e9:>13.2f} {sent[s] / 2**20:>18.2f}"
            + (f" {1e3 * ms[s]:>15.2f}" if ms else "")
        )
    rows.append(
        f"to next: the stage-to-stage bytes / step after each {'chunk' if chunked else 'stage'}"
        f" (activations forward + gradients back, whole global batch), total "
        f"{sum(sent) / 2**20:.2f} MiB"
    )
    return "\n".join(rows)
