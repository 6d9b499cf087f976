"""The candidates: every mesh of N devices over the registered axes and the settings the
trainer runs on it (`enumerate_candidates`), pure functions of the config (what runs is
jaxpar.parallel.validate's answer, refusals.py), and the default setting of a mesh
(`default_of`)."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import ml_collections

from jaxpar import axes as axes_lib
from jaxpar import configfile
from jaxpar.plan.refusals import check

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
        return math.prod(
            shape[a] for a in axes_lib.batch_axes(shape) if not axes_lib.get(a).shards_params
        )

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
        if names != DEFAULT_AXES or (
            config is not None and tuple(config.get("mesh_axes", DEFAULT_AXES)) != DEFAULT_AXES
        ):
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
        """The candidate as plan.json keeps it (its name and `exact` beside its fields)."""
        return {**dataclasses.asdict(self), "name": self.name, "exact": self.exact}

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> Candidate:
        """A candidate read back from `as_dict`'s form."""
        fields = {k: v for k, v in record.items() if k not in ("name", "exact")}
        fields["axes"] = tuple(fields.get("axes") or DEFAULT_AXES)
        return cls(**{**fields, "mesh": tuple(fields["mesh"])})


def factorisations(n: int, k: int = 3) -> list[tuple[int, ...]]:
    """Every k sizes with product n, the first axes' largest first ((data, stage, tensor):
    data-heavy first)."""
    if k == 1:
        return [(n,)]
    out = [
        (d, *rest) for d in range(1, n + 1) if n % d == 0 for rest in factorisations(n // d, k - 1)
    ]
    return sorted(out, key=lambda m: tuple(-x for x in m))


def meshes(
    n: int, nodes: int = 1, names: Sequence[str] | None = None
) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
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
        per_replica = (
            math.gcd(config.global_batch_size, eval_batch) // data
            if (config.global_batch_size % data == 0 and eval_batch % data == 0)
            else 0
        )
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
                                out.append(Candidate(mesh, schedule, m, remat, v, split, s, names))
    return out


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
