"""Choose a partitioning: enumerate every mesh of a profile's devices over the registered axes
(data, fsdp, stage, tensor, and node on a profile of several nodes; jaxpar/axes/) and the
settings the trainer runs on it, predict each on the profile (jaxpar.predict), rank them.

    from jaxpar.plan import enumerate_candidates, plan, rank
    valid, refused = enumerate_candidates(config, 8)          # pure: no compile
    result = plan(config, profile)                            # two rounds of predictions
    fitting, too_big = rank(result.rows, memory_bytes=8 * 2**30)

The enumeration and the refusals are pure functions of the config (jaxpar.parallel.validate
decides what runs); predicting compiles every candidate's programs with abstract inputs, so the
search is bounded: round 1 predicts one default setting per mesh, round 2 expands the pipeline
settings (schedule, micro-batches, recomputation, virtual stages), the synchronisation mode
and the split of the best few meshes, round 3 combines the best of each. CLI:
`python -m jaxpar.plan --config FILE --profile configs/hardware/X.py`.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import math
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ml_collections

from jaxpar import axes as axes_lib
from jaxpar import configfile, oneline, units
from jaxpar.errors import ConfigError

DEFAULT_AXES = axes_lib.DEFAULT

# Synchronisation modes that compute the single-device function (README "Synchronisation
# modes": tested equal to one device), and those that do not (periodic averaging, stale
# gradients, replicas trained apart): listed only with all_sync=True.
EXACT_SYNC = ("allreduce", "parameter_server", "sharded")
APPROX_SYNC = ("local_sgd", "async", "independent")
# Schedules in the order round 1 prefers them (1F1B first: GPipe's bubble with less memory).
SCHEDULES = ("1f1b", "gpipe", "zb-h1", "interleaved", "zb-v", "naive")
VIRTUAL_STAGES = (2, 4)  # interleaved only (1 is 1F1B itself)
# Split policies that need no measurement ("time" times the layers in a training run first).
SPLITS = ("flops", "params", "uniform")

__all__ = [
    "APPROX_SYNC",
    "EXACT_SYNC",
    "Candidate",
    "Plan",
    "check",
    "enumerate_candidates",
    "factorisations",
    "microbatch_counts",
    "plan",
    "rank",
    "space",
]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One partitioning: a mesh and the settings that matter on it (None where they do not)."""

    mesh: tuple[int, ...]  # sizes of `axes`
    schedule: str | None = None  # stage > 1 only
    microbatches: int | None = None
    remat: bool | None = None
    virtual: int = 1
    split: str | None = None
    sync: str = "allreduce"  # data > 1 only (else allreduce, which then does nothing)
    axes: tuple[str, ...] = DEFAULT_AXES

    @property
    def shape(self) -> dict[str, int]:
        return dict(zip(self.axes, self.mesh, strict=True))

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh)

    @property
    def stages(self) -> int:
        return axes_lib.num_stages(self.shape)

    @property
    def replicas(self) -> int:
        """Data replicas where the sync mode matters: the batch axes but fsdp's (which runs
        allreduce only)."""
        shape = self.shape
        return math.prod(shape[a] for a in axes_lib.batch_axes(shape)
                         if not axes_lib.get(a).shards_params)  # fmt: skip

    @property
    def named_axes(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The axes and sizes a command names: the default three when they suffice, else the
        axes of size > 1 (in the registry's order)."""
        if self.axes == DEFAULT_AXES:
            return self.axes, self.mesh
        used = [(a, n) for a, n in zip(self.axes, self.mesh) if n > 1] or [(self.axes[0], 1)]
        if {a for a, _ in used} <= set(DEFAULT_AXES):
            shape = self.shape
            return DEFAULT_AXES, tuple(shape.get(a, 1) for a in DEFAULT_AXES)
        return tuple(a for a, _ in used), tuple(n for _, n in used)

    @property
    def exact(self) -> bool:
        """Whether it computes the single-device function (False: approximate sync)."""
        return self.sync in EXACT_SYNC

    @property
    def name(self) -> str:
        names, sizes = self.named_axes
        if names == DEFAULT_AXES:
            parts = [f"({','.join(map(str, sizes))})"]
        else:
            parts = ["(" + ",".join(f"{a}={n}" for a, n in zip(names, sizes)) + ")"]
        if self.schedule:
            parts.append(f"{self.schedule} M={self.microbatches}")
            parts.append("remat" if self.remat else "no-remat")
            if self.virtual > 1:
                parts.append(f"v={self.virtual}")
            if self.split and self.split != "flops":
                parts.append(f"split={self.split}")
        if self.replicas > 1:
            parts.append(self.sync)
        return " ".join(parts)

    def overrides(self, config: ml_collections.ConfigDict | None = None) -> dict[str, Any]:
        """The `--config.KEY=VALUE` settings that make `config` this candidate."""
        names, sizes = self.named_axes
        out: dict[str, Any] = {}
        if names != DEFAULT_AXES or (config is not None and tuple(
                config.get("mesh_axes", DEFAULT_AXES)) != DEFAULT_AXES):  # fmt: skip
            out["mesh_axes"] = names
        out["mesh_shape"] = tuple(sizes)
        if self.schedule:
            out["pipeline.schedule"] = self.schedule
            out["pipeline.num_microbatches"] = self.microbatches
            out["pipeline.remat"] = bool(self.remat)
            out["pipeline.virtual_stages"] = self.virtual
            if self.split:
                out["pipeline.split"] = self.split
        if self.replicas > 1 or (config is not None and config.sync.mode != self.sync):
            out["sync.mode"] = self.sync
        if (
            self.sync in ("local_sgd", "independent")
            and config is not None
            and config.model.batch_norm
            and config.sync.batch_norm == "global"
        ):  # replicas trained apart keep their own statistics (the trainer's own advice)
            out["sync.batch_norm"] = "local"
        return out

    def apply(self, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
        """A copy of `config` set to this candidate."""
        return configfile.override(copy.deepcopy(config), self.overrides(config))

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "name": self.name, "exact": self.exact}


def factorisations(n: int, k: int = 3) -> list[tuple[int, ...]]:
    """Every k sizes with product n, the first axes' largest first ((data, stage, tensor):
    data-heavy first)."""
    if k == 1:
        return [(n,)]
    out = [(d, *rest) for d in range(1, n + 1) if n % d == 0
           for rest in factorisations(n // d, k - 1)]  # fmt: skip
    return sorted(out, key=lambda m: tuple(-x for x in m))


def meshes(n: int, nodes: int = 1, names: Sequence[str] | None = None
           ) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:  # fmt: skip
    """(axes, sizes) of every mesh of n devices the planner tries: every factorisation over
    `names` (default: every registered axis, a user's own included, but those placed across
    nodes); with `nodes` > 1 (a profile of several nodes that the run spans), also every one
    with an across-nodes axis (node) of that size first."""
    if names is None:
        names = [a for a in axes_lib.names() if not axes_lib.get(a).across_nodes]
    names = [a for a in names if not axes_lib.get(a).across_nodes]
    out = [(tuple(names), m) for m in factorisations(n, len(names))]
    across = [a for a in axes_lib.names() if axes_lib.get(a).across_nodes]
    if nodes > 1 and n % nodes == 0:
        for a in across[:1]:
            out += [((a, *names), (nodes, *m)) for m in factorisations(n // nodes, len(names))]
    return out


def microbatch_counts(per_replica: int, stages: int) -> list[int]:
    """Micro-batch counts worth trying on `stages` stages: powers of two and multiples of the
    stage count (interleaved and ZB-V need those), up to 4K, that divide the replica's batch."""
    wanted = {2**i for i in range(32) if 2**i <= 4 * stages}
    wanted |= {stages * i for i in (1, 2, 4)}
    return sorted(m for m in wanted if m <= per_replica and per_replica % m == 0)


BASELINE = Candidate((1, 1, 1))


def space(
    config: ml_collections.ConfigDict,
    n: int,
    all_sync: bool = False,
    splits: Sequence[str] = ("flops",),
    nodes: int = 1,
    axes: Sequence[str] | None = None,
) -> list[Candidate]:
    """Every candidate on n devices (spanning `nodes` nodes) over `axes` (`meshes`), before
    the trainer's refusals; plus the 1-device row."""
    syncs = EXACT_SYNC + (APPROX_SYNC if all_sync else ())
    eval_batch = config.eval_batch_size or config.global_batch_size
    out = [BASELINE] if n > 1 else []
    for names, mesh in meshes(n, nodes, axes):
        shape = dict(zip(names, mesh))
        data, stage = axes_lib.num_replicas(shape), axes_lib.num_stages(shape)
        sharded = bool(axes_lib.sharding_axes(shape))
        modes = syncs if data > 1 and not sharded else ("allreduce",)
        if stage == 1:
            out += [Candidate(mesh, sync=s, axes=names) for s in modes]
            continue
        per_replica = math.gcd(config.global_batch_size, eval_batch) // data if (
            config.global_batch_size % data == 0 and eval_batch % data == 0
        ) else 0  # fmt: skip
        counts = microbatch_counts(per_replica, stage) or [1]  # refused below, with the reason
        for schedule in SCHEDULES:
            # what the trainer always refuses is not offered: naive runs one micro-batch,
            # interleaved and ZB-V take M in multiples of the stages (when the batch allows
            # one), the zero-bubble schedules keep their residuals (no remat)
            grouped = [m for m in counts if m % stage == 0] or counts
            ms = {"naive": [1], "interleaved": grouped, "zb-v": grouped}.get(schedule, counts)
            for m in ms:
                for remat in (True, False) if not schedule.startswith("zb") else (False,):
                    for v in VIRTUAL_STAGES if schedule == "interleaved" else (1,):
                        for split in splits:
                            for s in modes:
                                out.append(Candidate(mesh, schedule, m, remat, v, split, s,
                                                     names))  # fmt: skip
    return out


def check(config: ml_collections.ConfigDict, candidate: Candidate) -> str | None:
    """Why the trainer refuses `candidate` for `config` (its one line), or None: every
    refusal of the config and the mesh, and those only the model tells (channels that do not
    divide, too few layers to cut); nothing is compiled."""
    from jaxpar import parallel

    try:
        applied = candidate.apply(config)
        shape = parallel.validate(applied, candidate.num_devices)
        parallel.check_model(applied, shape, _model(config))
    except (ValueError, KeyError, TypeError) as e:  # ConfigError is a ValueError
        return oneline.first_line(e)
    return None


_MODELS: dict = {}


def _model(config: ml_collections.ConfigDict):
    """The config's model (built once per model config: layers and shapes, nothing run)."""
    from jaxpar import models
    from jaxpar.predict.workload import input_spec

    spec = input_spec(config)
    key = (config.model.to_json(), repr(spec))
    if key not in _MODELS:
        _MODELS[key] = models.build(config.model, *spec)
    return _MODELS[key]


def enumerate_candidates(
    config: ml_collections.ConfigDict,
    n: int,
    all_sync: bool = False,
    splits: Sequence[str] = ("flops",),
    nodes: int = 1,
    axes: Sequence[str] | None = None,
) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """(candidates the trainer accepts, [(refused candidate, reason)]) on n devices spanning
    `nodes` nodes, over `axes` (default: every registered one)."""
    valid, refused = [], []
    for c in space(config, n, all_sync, splits, nodes, axes):
        reason = check(config, c)
        if reason is None:
            valid.append(c)
        else:
            refused.append((c, reason))
    return valid, refused


def commonest(refused: Iterable[tuple[Candidate, str]], top: int = 3) -> list[tuple[str, int]]:
    """The commonest refusal reasons with their counts: reasons that differ only in their
    numbers count as one (shown as its first instance)."""
    first: dict[str, str] = {}
    counts: collections.Counter = collections.Counter()
    for _, reason in refused:
        key = re.sub(r"\d+", "N", reason)
        first.setdefault(key, reason)
        counts[key] += 1
    return [(first[k], n) for k, n in counts.most_common(top)]


def default_of(config, candidates: Sequence[Candidate], all_sync: bool = False) -> Candidate:
    """Round 1's one setting for a mesh: 1F1B, M = the largest count up to 4K, the config's
    recomputation, one chunk per stage, the config's sync mode (if listed), the first split."""
    own = config.sync.mode if config.sync.mode in EXACT_SYNC or all_sync else "allreduce"

    def key(c: Candidate):
        k = c.stages
        m = c.microbatches or 1
        return (
            c.sync != own,
            SCHEDULES.index(c.schedule) if c.schedule else 0,
            bool(c.remat) != bool(config.pipeline.remat) if c.schedule else False,
            -m if m <= 4 * k else m,
            c.virtual,
            c.split not in (None, "flops"),
        )

    return min(candidates, key=key)


@dataclasses.dataclass
class Plan:
    """Every candidate predicted (rows, in prediction order), the trainer's refusals, and the
    1-device baseline row."""

    rows: list[dict[str, Any]]
    refused: list[tuple[Candidate, str]]
    baseline: dict[str, Any] | None
    num_devices: int
    considered: int  # candidates the trainer accepts (predicted or not)
    skipped: int  # accepted but not predicted (not in round 2's meshes, or over the bound)
    meshes: int = 0  # meshes the trainer accepts
    meshes_unseen: int = 0  # of those, meshes round 1 did not reach (--max_candidates)


def _fast(row: dict) -> float:
    return row["step_time_s"] if row.get("status") == "ok" else math.inf


def plan(
    config: ml_collections.ConfigDict,
    profile,
    num_devices: int | None = None,
    all_sync: bool = False,
    splits: Sequence[str] = ("flops",),
    expand: int = 3,
    max_candidates: int = 40,
    memory_bytes: float | None = None,
    predict: Callable | None = None,
    log: Callable[[str], None] | None = None,
    axes: Sequence[str] | None = None,
) -> Plan:
    """Predict the candidates of `config` on `profile` in rounds, at most `max_candidates`
    predictions (the 1-device baseline included). `predict(config, profile) -> row` defaults to
    jaxpar.predict.predict_config."""
    if predict is None:
        from jaxpar.predict import predict_config as predict
    n = num_devices or profile.num_devices
    if n > profile.num_devices:
        raise ConfigError(f"--devices {n}: profile {profile.name} has {profile.num_devices}")
    limit = profile.memory_bytes if memory_bytes is None else memory_bytes
    nodes = -(-n // max(profile.devices_per_node, 1))
    valid, refused = enumerate_candidates(config, n, all_sync, splits, nodes, axes)
    meshes = list(dict.fromkeys((c.axes, c.mesh) for c in valid if c != BASELINE or n == 1))
    if not meshes:
        (reason, _), *_ = commonest(refused, 1) or [("nothing to try", 0)]
        raise ConfigError(
            f"no partitioning of {n} devices runs this config (global_batch_size "
            f"{config.global_batch_size}); commonest refusal: {reason}"
        )
    by_mesh = {m: [c for c in valid if (c.axes, c.mesh) == m] for m in meshes}
    rows: list[dict] = []
    done: dict[Candidate, dict] = {}
    say = log or (lambda s: print(s, file=sys.stderr, flush=True))
    t0 = time.perf_counter()

    def run(batch: list[Candidate], round_name: str) -> None:
        batch = [c for c in dict.fromkeys(batch) if c not in done]
        room = max_candidates - len(done)
        total_planned = len(done) + min(len(batch), room)
        for c in batch[: max(room, 0)]:
            t = time.perf_counter()
            row = _predict_one(predict, config, c, profile, refused)
            done[c] = row
            if row is not None:
                rows.append(row)
            elapsed = time.perf_counter() - t0
            rate = len(done) / elapsed if elapsed else 0.0
            eta = (total_planned - len(done)) / rate if rate else 0.0
            say(_progress_line(len(done), total_planned, round_name, c, row, limit,
                               time.perf_counter() - t, rate, eta))  # fmt: skip

    baseline_c = BASELINE
    first = ([baseline_c] if n > 1 and baseline_c in valid else []) + [
        default_of(config, by_mesh[m], all_sync) for m in meshes
    ]
    run(first, "round 1")
    unseen = sum(default_of(config, by_mesh[m], all_sync) not in done for m in meshes)
    baseline = done.get(baseline_c) or (done.get(first[0]) if n == 1 else None)

    def order(m):  # fitting first, then predicted step time
        row = done.get(default_of(config, by_mesh[m], all_sync))
        if row is None or row.get("status") != "ok":
            return (2, math.inf)
        return (0 if row["memory_bytes_per_device"] <= limit else 1, row["step_time_s"])

    best_meshes = sorted(meshes, key=order)[:expand]
    defaults = {m: default_of(config, by_mesh[m], all_sync) for m in best_meshes}
    lanes = []
    for m in best_meshes:
        d = defaults[m]
        knobs = [c for c in by_mesh[m] if c.sync == d.sync and c.split == d.split]
        syncs = [c for c in by_mesh[m] if _same_pipeline(c, d) and c.split == d.split]
        split_v = [c for c in by_mesh[m] if _same_pipeline(c, d, split=False) and c.sync == d.sync]
        near = lambda c, d=d: (
            abs(math.log2(c.microbatches or 1) - math.log2(d.microbatches or 1)),
            c.remat != d.remat,
            SCHEDULES.index(c.schedule) if c.schedule else 0,
            c.virtual,
        )
        lanes.append([c for c in syncs + split_v + sorted(knobs, key=near) if c != d])
    run(_round_robin(lanes), "round 2")
    combos = []
    for m in best_meshes:
        mine = [(c, done[c]) for c in by_mesh[m] if done.get(c)]
        d = defaults[m]
        knob = min((p for p in mine if p[0].sync == d.sync and p[0].split == d.split),
                   key=lambda p: _fast(p[1]), default=(d, None))[0]  # fmt: skip
        sync = min((p for p in mine if _same_pipeline(p[0], d) and p[0].split == d.split),
                   key=lambda p: _fast(p[1]), default=(d, None))[0]  # fmt: skip
        combo = dataclasses.replace(knob, sync=sync.sync)
        if combo in by_mesh[m] and combo not in done:
            combos.append(combo)
    run(combos, "round 3")
    base_step = baseline["step_time_s"] if baseline and baseline.get("status") == "ok" else None
    for r in rows:
        ok = base_step and r.get("status") == "ok"
        r["speedup"] = base_step / r["step_time_s"] if ok else None
        r["fits_limit"] = r.get("status") == "ok" and r["memory_bytes_per_device"] <= limit
    return Plan(rows, refused, baseline, n, len(valid), len(valid) - len(done), len(meshes),
                unseen)  # fmt: skip


def _same_pipeline(a: Candidate, b: Candidate, split: bool = True) -> bool:
    same = (a.schedule, a.microbatches, a.remat, a.virtual) == (
        b.schedule, b.microbatches, b.remat, b.virtual)  # fmt: skip
    return same and (not split or a.split == b.split)


def _round_robin(lanes: list[list]) -> list:
    out = []
    for i in range(max(map(len, lanes), default=0)):
        out += [lane[i] for lane in lanes if i < len(lane)]
    return out


def _predict_one(predict, config, c: Candidate, profile, refused: list) -> dict | None:
    """The candidate's predicted row; a refusal at build time joins `refused` (None)."""
    try:
        row = predict(c.apply(config), profile)
    except ValueError as e:  # ConfigError: the strategy refused it while building
        refused.append((c, oneline.first_line(e)))
        return None
    except Exception as e:  # noqa: BLE001 - one candidate's failure is its row, not the plan's
        row = {"status": "failed", "error": f"{type(e).__name__}: {oneline.first_line(e)}"}
    if row.get("status") == "ok" and predict_is_default(predict):
        row["collective_calls_per_step"] = _calls(c.apply(config), profile)
    return {**row, "candidate": c.as_dict(), "name": c.name}


def predict_is_default(predict) -> bool:
    return getattr(predict, "__module__", "") == "jaxpar.predict"


def _calls(config, profile) -> dict[str, int]:
    """Collective calls per step by "kind axes", from the predictor's cached workload ({} if
    it cannot be read: the predictor's internals are not this module's contract)."""
    try:
        from jaxpar.parallel import schedules
        from jaxpar.predict.workload import workload

        w = workload(config, profile.num_devices)
        out: dict[str, int] = {}
        for chunk in w.chunks:
            for phase, cols in chunk.collectives.items():
                times = schedules.calls_per_step(phase, w.num_microbatches)
                for col in cols:
                    key = f"{col.kind} {col.axes}"
                    out[key] = out.get(key, 0) + col.count * times
        return out
    except Exception:  # noqa: BLE001
        return {}


def _progress_line(i, total, round_name, c, row, limit, took, rate, eta) -> str:
    if row is None:
        what = "refused while building"
    elif row.get("status") != "ok":
        what = f"failed: {row.get('error')}"
    else:
        fit = "" if row["memory_bytes_per_device"] <= limit else "  does not fit"
        what = (f"{1e3 * row['step_time_s']:9.3f} ms  {row['memory_bytes_per_device'] / 2**30:6.2f}"
                f" GiB{fit}")  # fmt: skip
    return (f"[{i:3d}/{total}] {round_name}  {c.name:<44} {what}  ({took:.1f} s; "
            f"{rate:.2f}/s, ETA {units.clock(eta)})")  # fmt: skip


def rank(rows: Sequence[dict], memory_bytes: float) -> tuple[list[dict], list[dict]]:
    """(candidates that fit `memory_bytes` per device, fastest first; those that do not,
    fastest first). Failed predictions are in neither."""
    ok = sorted((r for r in rows if r.get("status") == "ok"), key=lambda r: r["step_time_s"])
    fitting = [r for r in ok if r["memory_bytes_per_device"] <= memory_bytes]
    return fitting, [r for r in ok if r["memory_bytes_per_device"] > memory_bytes]


def unpriced(row: dict) -> dict[str, int]:
    """Collectives the predictor could not place on mesh axes ("?"), which it would price at
    0 s. None today: groups come from replica groups, source-target pairs, or every device
    (tests/test_perfmodel.py); kept as a guard for collectives a future XLA prints otherwise."""
    cols = row.get("collective_bytes_per_device") or {}
    total = sum(cols.values())  # a few kB of metrics among megabytes do not count
    return {k: v for k, v in cols.items() if k.endswith(" ?") and v > 0.01 * total}


def why(row: dict, profile) -> str:
    """What dominates the predicted step, in a few words (and what the prediction leaves out)."""
    text = _why(row, profile)
    missing = unpriced(row)
    if missing:
        text += "; NOT priced: " + ", ".join(f"{k} {v / 1e6:,.1f} MB" for k, v in missing.items())
    return text


def _why(row: dict, profile) -> str:
    step = row["step_time_s"]
    parts = {k: row.get(f"{k}_s", 0.0) or 0.0 for k in ("compute", "comm", "bubble", "overhead")}
    share = {k: v / step for k, v in parts.items()} if step else parts
    worst = max(("comm", "bubble", "overhead"), key=lambda k: share[k])
    if share["compute"] >= 0.8 or share[worst] < 0.05:
        return f"compute-bound: compute {100 * share['compute']:.0f}% of step"
    head = f"{worst} {100 * share[worst]:.0f}% of step"
    if worst == "comm":
        cols = row.get("collective_bytes_per_device") or {}
        if not cols:
            return f"{head}: stage-boundary sends"
        priced = {k: v for k, v in cols.items() if k not in unpriced(row)} or cols
        on = {k: _link(row, profile, k) for k in priced}
        kind, nbytes = max(priced.items(), key=lambda kv: kv[1] / on[kv[0]][0])
        link, where = on[kind]
        calls = row.get("collective_calls_per_step") or {}
        moved = sum(v / on[k][0] for k, v in priced.items())  # seconds at full bandwidth
        if calls and moved < 0.5 * row["comm_s"]:  # the per-call latency dominates
            top, n = max(calls.items(), key=lambda kv: kv[1])
            return (f"{head}: latency-bound, {sum(calls.values())} collective calls/step "
                    f"(most: {top} x{n}) at {1e6 * _latency(row, profile):g} us per ring step")  # fmt: skip
        return f"{head}: {kind} {nbytes / 1e6:,.1f} MB/step over {where} ({link / 1e9:g} GB/s)"
    if worst == "bubble":
        c = row.get("candidate") or {}
        k = candidate_of(row).stages if c else 0
        return f"{head}: {c.get('schedule')} K={k} M={c.get('microbatches')}"
    return f"{head}: host dispatch of the step's programs"


def _latency(row: dict, profile) -> float:
    nodes = math.ceil(row.get("num_devices", 1) / max(profile.devices_per_node, 1))
    return (profile.inter if nodes > 1 else profile.intra).latency


def _link(row: dict, profile, collective: str = "") -> tuple[float, str]:
    """(bandwidth, where) of the links a collective ("kind axes", e.g. "all-gather data")
    runs on: the inter-node ones when its group of devices spans nodes (devices numbered in
    mesh order, `devices_per_node` to a node), else the intra-node ones."""
    per_node = max(profile.devices_per_node, 1)
    nodes = math.ceil(row.get("num_devices", 1) / per_node)
    names, sizes = row.get("mesh_axes") or (), row.get("mesh_shape") or ()
    group = collective.rpartition(" ")[2].split("+")
    if nodes > 1 and len(names) == len(sizes) and set(group) <= set(names):
        strides = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
        last = sum((n - 1) * st for a, n, st in zip(names, sizes, strides) if a in group)
        if last < per_node:  # the group's devices all sit in one node
            nodes = 1
    if nodes > 1:
        return profile.inter.ring_bandwidth, f"{nodes} nodes"
    return profile.intra.ring_bandwidth, "intra-node links"


def command(config_file: str, row_or_candidate, config=None, extra: dict | None = None) -> str:
    """The `python -m jaxpar.train` command line that runs a candidate."""
    c = candidate_of(row_or_candidate) if isinstance(row_or_candidate, dict) else row_or_candidate
    args = ["python", "-m", "jaxpar.train", "--config", config_file]
    settings = {**(extra or {}), **c.overrides(config)}
    for key, value in settings.items():
        args.append(f"--config.{key}={_flag(value)}")
    return " ".join(shlex.quote(a) for a in args)


def candidate_of(row: dict) -> Candidate:
    fields = {k: v for k, v in row["candidate"].items() if k not in ("name", "exact")}
    fields["axes"] = tuple(fields.get("axes") or DEFAULT_AXES)
    return Candidate(**{**fields, "mesh": tuple(fields["mesh"])})


def _flag(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        items = [f'"{v}"' if isinstance(v, str) else str(v) for v in value]
        return "(" + ",".join(items) + ("," if len(value) == 1 else "") + ")"
    return str(value)
