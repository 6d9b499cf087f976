"""What every chunk program takes, as abstract arguments: the one description of them that the
runner (receiving from another process), `Pipeline.programs` (analysis, `--explain`, the bench)
and the predictor all use.

`boundary_shapes` walks the model once: each chunk's output for a micro-batch. `program_args`
compiles what it must to learn the rest: a residual program's stored leaves are what the
chunk's `fwd_res` returns (its compiled outputs, shardings included), and the weight-gradient
program takes what `bwd_in` returns, so the shapes are exactly those the runner passes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def boundary_shapes(model, chunks, rows: int) -> list[jax.ShapeDtypeStruct]:
    """Per chunk, its output for a micro-batch of `rows` images (global shape, no sharding)."""
    x = jax.ShapeDtypeStruct((rows, *model.input_shape), jnp.float32)
    out = []
    for ck in chunks:
        variables = model.variable_shapes(ck.layers)
        with jax.set_mesh(ck.mesh):  # tensor layout rules resolve against the stage
            x = jax.eval_shape(
                lambda v, x, ck=ck: model.apply(
                    v["params"],
                    v["batch_stats"],
                    x,
                    train=False,
                    layers=ck.layers,
                    constrain=ck.constrain,
                )[0],
                variables,
                x,
            )
        out.append(jax.ShapeDtypeStruct(x.shape, x.dtype))
    return out


def _on(mesh, spec: P, shape) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=NamedSharding(mesh, spec))


def outputs(lowered):
    """A lowered program's outputs as abstract arrays with the shardings the compiled program
    gives them (what the next program receives at run time)."""
    shardings = lowered.compile().output_shardings
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), lowered.out_info, shardings
    )


def step_programs(remat: bool, split_backward: bool, last: bool, adapt: bool = False) -> list[str]:
    """The programs a training step runs for one chunk, in event order (`adapt`: the update
    in two halves around the model's squared norms, for an adapting rate)."""
    update = ["combine", "apply_update"] if adapt else ["update"]
    if remat:
        return ([] if last else ["fwd"]) + ["bwd", *update]
    backward = ["bwd_in", "bwd_w"] if split_backward else ["bwd_res"]
    return ["fwd_res", *backward, *update]


def program_args(pipe, c: int, rows: int, names: list[str]) -> dict[str, tuple]:
    """Abstract arguments of chunk c's programs `names` for micro-batches of `rows` images.
    `pipe` gives the chunk descriptions, their programs, placed-state shapes and boundaries."""
    ck, progs = pipe.chunks[c], pipe.programs_of[c].programs
    boundary = pipe.boundary(rows)
    data = lambda shape: _on(ck.mesh, ck.replicas.spec, shape)
    image = jax.ShapeDtypeStruct((rows, *pipe.model.input_shape), jnp.float32)
    x = data(image if ck.first else boundary[c - 1])
    label = data(jax.ShapeDtypeStruct((rows,), jnp.int32))
    mask = data(jax.ShapeDtypeStruct((rows,), jnp.float32))
    cot = () if ck.last else (data(boundary[c]),)
    state, acc = pipe.chunk_state_shapes(c)
    args: dict[str, Any] = {
        "fwd": (state, x),
        "bwd": (state, x, *(cot or (label,)), acc),
        "update": (state, acc),
        "combine": (state, acc),
        "eval": (state, x, label, mask) if ck.last else (state, x),
        "fwd_res": (state, x, *(() if cot else (label,))),
    }
    if any(name in names for name in ("bwd_res", "bwd_in", "bwd_w")):
        stored = outputs(progs["fwd_res"].lower(*args["fwd_res"]))[2]
        args["bwd_res"] = (state, stored, *cot, acc)
        args["bwd_in"] = (state, stored, *cot)
        if "bwd_w" in names:
            outs = outputs(progs["bwd_in"].lower(*args["bwd_in"]))
            args["bwd_w"] = (state, stored, outs if ck.first else outs[1], acc)
    if "apply_update" in names:
        combined = outputs(progs["combine"].lower(*args["combine"]))[0]
        scalar = _on(ck.mesh, P(), jax.ShapeDtypeStruct((), jnp.float32))
        args["apply_update"] = (state, combined, (scalar, scalar))
    return {name: args[name] for name in names}
