"""`python -m jaxpar.train --config FILE --explain`: what a configuration will do, without
training. The mesh, the per-stage table, every parameter's PartitionSpec, memory per device,
the collectives the compiled step performs (kind, mesh axis, bytes per device per step; one
that runs once every K steps, as local_sgd's average, at its per-step average and said so),
and the stage-to-stage bytes per step, read from the compiled programs. (Why the planner's
predicted rows are what they are is jaxpar/plan/reasons.py.)
"""

from __future__ import annotations

import re

import jax

from jaxpar import analysis, metrics, run_setup, units
from jaxpar import axes as axes_lib


def _key(entry) -> str:
    return str(getattr(entry, "key", entry))


def natural(text: str) -> tuple:
    """Sort key reading digit runs as numbers: conv8 before conv10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _layouts(setup, strategy) -> list[str]:
    """Every parameter's shape and PartitionSpec, in layer order (names in natural order
    within a layer), with the pipeline stage (and chunk, where stages hold several) whose
    devices hold it."""
    order = {layer.name: i for i, layer in enumerate(setup.model.layers)}
    staged = strategy.num_stages > 1
    bounds = strategy.bounds or (0, len(setup.model.layers))
    chunked = staged and len(bounds) - 1 > strategy.num_stages
    found = []
    for stage, pairs in enumerate(strategy.stage_states(strategy.state_shapes())):
        for st, _ in pairs:
            for path, leaf in jax.tree_util.tree_flatten_with_path(st.params)[0]:
                keys = [_key(k) for k in path]
                layer = next((order[k] for k in keys if k in order), len(order))
                found.append((layer, natural("/".join(keys)), stage, "/".join(keys), leaf))
    head = "parameter layouts (PartitionSpec over the mesh axes"
    head += "; stage: the pipeline stage whose devices hold it" if staged else ""
    head += ", chunk: its layers' chunk)" if chunked else ")"
    out = [head + ":"]
    where_head = (f"{'stage':>5} {'chunk':>5} " if chunked else f"{'stage':>5} ") if staged else ""
    out.append(f"  {where_head}{'parameter':<34} {'shape':<20} PartitionSpec")
    for layer, _, stage, name, leaf in sorted(found, key=lambda f: f[:2]):
        where = ""
        if staged:
            where = f"{stage:>5} "
            if chunked:
                chunk = next(c for c in range(len(bounds) - 1) if layer < bounds[c + 1])
                where += f"{chunk:>5} "
        out.append(f"  {where}{name:<34} {leaf.shape!s:<20} {leaf.sharding.spec}")
    return out


def _collectives(fig) -> list[str]:
    """The collectives table (bytes per device per step); one that runs once every K steps
    shows its per-step average and says so."""
    out = ["\ncollectives (bytes per device per step, from the compiled programs):"]
    out.append(f"  {'program':<8} {'kind':<20} {'mesh axis':<14} {'count':>5} {'bytes':>14}")
    rows = fig["collectives"]
    trivial = sum(r[3] for r in rows if r[2] == "none")
    rows = [r for r in rows if r[2] != "none"]
    if not rows:
        out.append("  none")
    for where, kind, axes, count, nbytes, every in rows:
        line = f"  {where:<8} {kind:<20} {axes:<14} {count:>5} {round(nbytes):>14,}"
        if every > 1:
            line += (
                f"  once every {every} steps: {round(nbytes * every):,} bytes each time, "
                "the per-step average shown"
            )
        out.append(line)
    if trivial:
        out.append(f"  ({trivial} reductions over one-device groups move nothing; not listed)")
    return out


def _between_stages(fig) -> list[str]:
    """The stage-to-stage bytes / step (the summary's and the stage table's figure) and the
    most of them one device receives."""
    if fig["bytes_between_stages_per_step"] is None:
        return []
    total, mine = fig["bytes_between_stages_per_step"], fig["stage_transfer_bytes_per_device"]
    label, meaning = metrics.STAGE_TO_STAGE_LABEL, metrics.STAGE_TO_STAGE_MEANING
    whole = f"({meaning}: the stage table's column, summed)"
    share = "(its share of them: the batch is split over the batch axes)"
    return [
        "\nbetween pipeline stages (device_put, not collectives):",
        f"  {label:<31} {units.mib(total):>12}  {whole}",
        f"  {'most one device receives / step':<31} {units.mib(mine):>12}  {share}",
    ]


def explain(config, devices=None) -> str:
    """The `--explain` report of `config` on `devices` (all by default): built and compiled,
    never run."""
    setup = run_setup.setup(config, devices)
    strategy, mesh, batch = setup.strategy, setup.mesh, setup.spec.batches.global_size
    head = (
        f"mesh {units.named_mesh(mesh.axis_names, tuple(mesh.shape.values()))} over "
        f"{mesh.devices.size} {jax.default_backend()} devices: {strategy.partitioning()}, "
        f"run by strategy {strategy.name}; global batch {batch}"
    )
    roles = [
        f"  {a:<8} {mesh.shape[a]:>3}  {axes_lib.get(a).role:<7} {axes_lib.get(a).doc}"
        for a in mesh.axis_names
    ]
    model = (
        f"model {setup.model.name}: {setup.model.num_params:,} parameters, "
        f"{setup.model.flops_per_example / 1e6:,.1f} forward MFLOPs per image"
    )
    out = [head, "axes (name, size, role, what it splits):", *roles, model]
    if described := strategy.describe(batch):
        out.append(described)
    for name in axes_lib.used(dict(mesh.shape)):
        if described := axes_lib.get(name).describe(config, dict(mesh.shape), setup.model):
            out.append(described)
    out.append("")
    out += _layouts(setup, strategy)

    fig = analysis.report(strategy, batch, timing=False)
    params, opt = fig["param_bytes_per_device"], fig["opt_state_bytes_per_device"]
    temp, stash = fig["program_temp_bytes_per_device"], fig["stored_activation_bytes_per_device"]
    out.append("\nmemory per device (largest over devices):")
    out.append(f"  parameters            {units.mib(params)}")
    out.append(f"  optimizer state       {units.mib(opt)}")
    out.append(f"  activations, working  {units.mib(temp)}  (compiled programs' temporaries)")
    if stash:
        out.append(f"  activations, stored   {units.mib(stash)}  (stage inputs kept for backward)")
    out += _collectives(fig)
    out += _between_stages(fig)
    return "\n".join(out)
