"""`python -m jaxpar.train --config FILE --explain`: what a configuration will do, without
training. The mesh, the per-stage table, every parameter's PartitionSpec, memory per device,
and the collectives the compiled step performs (kind, mesh axis, bytes per device per step),
read from the compiled programs.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np

from jaxpar import hlo, trainer
from jaxpar.parallel import schedules

_IOTA = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")


def parse_groups(text: str) -> list[list[int]]:
    """Replica groups as lists of device indices, from either HLO form:
    explicit `{{0,4},{1,5}}` or iota `[2,4]<=[8]` / `[4,2]<=[2,4]T(1,0)`."""
    if text.startswith("mesh["):  # mesh['axis_0'=2,'axis_1'=4] {'axis_1'}: groups vary along
        sizes = [(n, int(v)) for n, v in re.findall(r"'(\w+)'=(\d+)", text.split("]")[0])]
        chosen = re.findall(r"'(\w+)'", text.split("]", 1)[1])
        ids = np.arange(int(np.prod([v for _, v in sizes]))).reshape([v for _, v in sizes])
        order = [i for i, (n, _) in enumerate(sizes) if n not in chosen] + [
            i for i, (n, _) in enumerate(sizes) if n in chosen
        ]
        size = int(np.prod([v for n, v in sizes if n in chosen]))
        return ids.transpose(order).reshape(-1, size).tolist()
    match = _IOTA.fullmatch(text.strip())
    if match:
        shape = [int(x) for x in match.group(1).split(",")]
        dims = [int(x) for x in match.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if match.group(3):
            ids = ids.transpose([int(x) for x in match.group(3).split(",")])
        return ids.reshape(shape[0], -1).tolist()
    return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", text)]


def mesh_axes_of(groups: list[list[int]], mesh_shape: dict[str, int]) -> str:
    """Which mesh axes a collective runs over: those whose coordinate varies in a group."""
    names, sizes = list(mesh_shape), list(mesh_shape.values())
    varying: set[str] = set()
    for group in groups:
        coords = np.array([np.unravel_index(i, sizes) for i in group])
        varying |= {names[a] for a in range(len(names)) if len(set(coords[:, a])) > 1}
    return "+".join(n for n in names if n in varying) or "none"


def collective_rows(text: str, mesh_shape: dict[str, int], times: int = 1) -> dict:
    """{(kind, axes): [count, bytes]} per step for a program run `times` times a step."""
    rows: dict[tuple[str, str], list[int]] = {}
    for c in hlo.collectives(text):
        axes = mesh_axes_of(parse_groups(c.groups), mesh_shape) if c.groups else "?"
        entry = rows.setdefault((c.kind, axes), [0, 0])
        entry[0] += times
        entry[1] += times * c.bytes
    return rows


def _per_device_bytes(tree: Any) -> int:
    """Largest per-device share of a placed pytree."""
    per: dict = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            per[shard.device] = per.get(shard.device, 0) + shard.data.nbytes
    return max(per.values()) if per else 0


def _mb(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB"


def explain(config, devices=None) -> str:
    s = trainer.setup(config, devices)
    strategy, mesh = s.strategy, s.mesh
    shape = dict(mesh.shape)
    head = (
        f"mesh (data, stage, tensor) = {tuple(shape.values())} over {mesh.devices.size} "
        f"{jax.default_backend()} devices; strategy {strategy.name}; global batch "
        f"{config.global_batch_size}"
    )
    model = (
        f"model {s.model.name}: {s.model.num_params:,} parameters, "
        f"{s.model.flops_per_example / 1e6:,.1f} forward MFLOPs per image"
    )
    out = [head, model]
    if hasattr(strategy, "describe"):
        out.append(strategy.describe(config.global_batch_size))
    state = strategy.init_state(jax.random.key(config.seed))
    batch = strategy.put_batch(trainer.local_train_batch(s, 0))
    stages = getattr(state, "stages", (state,))

    out.append("\nparameter layouts (PartitionSpec over the mesh axes):")
    for st in stages:
        for path, leaf in jax.tree_util.tree_flatten_with_path(st.params)[0]:
            name = "/".join(str(getattr(k, "key", k)) for k in path)
            spec = getattr(leaf.sharding, "spec", "?")
            out.append(f"  {name:<34} {leaf.shape!s:<20} {spec}")

    rows: dict = {}
    temp = 0
    if hasattr(strategy, "programs"):  # pipeline: one set of programs per stage
        figures = strategy.measure(state, batch, repeats=1)
        temp = max(figures["stage_program_temp_bytes"])
        for name, progs in strategy.programs.items():
            if name == "eval":
                continue
            times = 1 if name == "update" else strategy.num_microbatches
            for st_i, prog in enumerate(progs):
                args = _stage_args(strategy, state, batch, name, st_i)
                if args is None:
                    continue
                text = prog.lower(*args).compile().as_text()
                stage_mesh = dict(strategy.meshes[st_i].shape)
                for (kind, axes), (count, nbytes) in collective_rows(
                    text, stage_mesh, times
                ).items():
                    entry = rows.setdefault((f"stage {st_i}", kind, axes), [0, 0])
                    entry[0] += count
                    entry[1] += nbytes
        stash = max(
            schedules.in_flight(ev) * batch["image"][0].nbytes // strategy.data
            for ev in strategy.events
        )
    else:
        compiled = strategy.compile(state, batch)
        rows = {("step",) + key: v for key, v in collective_rows(compiled.as_text(), shape).items()}
        temp = (
            compiled.memory_analysis().temp_size_in_bytes
            if hasattr(compiled, "memory_analysis")
            else 0
        )
        stash = 0

    params = max(_per_device_bytes(st.params) for st in stages)
    opt = max(_per_device_bytes(st.opt_state) for st in stages)
    out.append("\nmemory per device (largest over devices):")
    out.append(f"  parameters            {_mb(params)}")
    out.append(f"  optimizer state       {_mb(opt)}")
    out.append(f"  activations, working  {_mb(temp)}  (compiled programs' temporaries)")
    if stash:
        out.append(f"  activations, stored   {_mb(stash)}  (stage inputs kept for backward)")

    out.append("\ncollectives per step (bytes per device, from the compiled programs):")
    out.append(f"  {'program':<8} {'kind':<20} {'mesh axis':<14} {'count':>5} {'bytes':>14}")
    trivial = sum(count for (_, _, axes), (count, _) in rows.items() if axes == "none")
    rows = {key: value for key, value in rows.items() if key[2] != "none"}
    if not rows:
        out.append("  none")
    for (where, kind, axes), (count, nbytes) in sorted(rows.items()):
        out.append(f"  {where:<8} {kind:<20} {axes:<14} {count:>5} {nbytes:>14,}")
    if trivial:
        out.append(f"  ({trivial} reductions over one-device groups move nothing; not listed)")
    if hasattr(strategy, "bytes_between_stages"):
        sent = strategy.bytes_between_stages(config.global_batch_size) // strategy.data
        out.append(
            f"  {'stages':<8} {'transfers':<20} {'stage':<14} {'':>5} {sent:>14,}"
            "  (activations forward, gradients back, per data replica; device_put)"
        )
    return "\n".join(out)


def _stage_args(strategy, state, batch, name: str, s: int):
    """Example arguments to lower stage program `name` of stage s (shapes are what matter)."""
    st, acc = state.stages[s], state.grad_acc[s]
    x = batch["image"][0]
    for prev in range(s):  # walk the forward to this stage's input shape
        p = state.stages[prev]
        x, _ = strategy.programs["fwd"][prev](p.params, p.batch_stats, x)
        x = jax.device_put(x, strategy.batch_sharding[prev + 1])
    last = s == strategy.num_stages - 1
    if name == "fwd":
        return None if last else (st.params, st.batch_stats, x)
    if name == "bwd":
        if last:
            target = batch["label"][0]
        else:
            y, _ = strategy.programs["fwd"][s](st.params, st.batch_stats, x)
            target = jax.numpy.zeros_like(y)
        return (st.params, st.batch_stats, x, target, acc)
    return (st, acc)
