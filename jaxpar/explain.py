"""`python -m jaxpar.train --config FILE --explain`: what a configuration will do, without
training. The mesh, the per-stage table, every parameter's PartitionSpec, memory per device,
and the collectives the compiled step performs (kind, mesh axis, bytes per device per step),
read from the compiled programs.
"""

from __future__ import annotations

import jax

from jaxpar import analysis, trainer


def _mb(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _key(entry) -> str:
    return str(getattr(entry, "key", entry))


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
    if described := strategy.describe(config.global_batch_size):
        out.append(described)
    shapes = strategy.state_shapes()  # abstract: nothing is allocated
    out.append("\nparameter layouts (PartitionSpec over the mesh axes):")
    order = {layer.name: i for i, layer in enumerate(s.model.layers)}
    for stage, pairs in enumerate(strategy.stage_states(shapes)):
        where = f"  (stage {stage})" if strategy.num_stages > 1 else ""
        leaves = [leaf for st, _ in pairs
                  for leaf in jax.tree_util.tree_flatten_with_path(st.params)[0]]  # fmt: skip
        for path, leaf in sorted(leaves, key=lambda item: order.get(_key(item[0][0]), 0)):
            name = "/".join(_key(k) for k in path)
            out.append(f"  {name:<34} {leaf.shape!s:<20} {leaf.sharding.spec}{where}")

    fig = analysis.report(strategy, config.global_batch_size, timing=False)
    params, opt = fig["param_bytes_per_device"], fig["opt_state_bytes_per_device"]
    temp, stash = fig["program_temp_bytes_per_device"], fig["stored_activation_bytes_per_device"]
    rows = {(w, k, a): (c, b) for w, k, a, c, b in fig["collectives"]}
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
    if fig["bytes_between_stages_per_replica"] is not None:
        sent = fig["bytes_between_stages_per_replica"]
        out.append(
            f"  {'stages':<8} {'transfers':<20} {'stage':<14} {'':>5} {sent:>14,}"
            "  (activations forward, gradients back, per data replica; device_put)"
        )
    return "\n".join(out)
