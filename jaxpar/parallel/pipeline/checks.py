"""What a pipeline run needs of its config, checked before anything is built (one line each)."""

from __future__ import annotations

from jaxpar import axes
from jaxpar.config import check
from jaxpar.parallel import schedules, stages, tensor, variables


def model_problem(config, shape: dict[str, int], model) -> str | None:
    """Why `model` cannot be cut and split as `config` says on this mesh, or None: too few
    layers for the chunks (interleaved and ZB-V cut more chunks than stages), cut points out of
    range, channels that do not divide over the rules axes."""
    schedule = config.pipeline.schedule
    v = config.pipeline.virtual_stages if schedule == "interleaved" else 1
    chunks = len(schedules.placement(schedule, axes.num_stages(shape), v))
    if model.stochastic:
        return _no_dropout(f"{model.name} uses dropout in training;")
    policy = config.pipeline.split
    if model.times is None and stages.parse(policy) == "time":
        # run_setup.setup times the layers after this check; what can be refused before (too
        # few layers for the chunks) does not depend on where the cuts fall
        policy = "uniform"
    try:
        stages.split(model, chunks, policy)
    except ValueError as e:  # SplitError
        return str(e)
    if axes.auto_axes(shape):
        return tensor.problem(model, variables.rules_on(tensor.rules_from(config), shape), shape)
    return None


def problem(config, shape: dict[str, int]) -> str | None:
    """Why a pipeline cannot run `config` on the mesh `shape` ({axis: size}), or None."""
    try:
        require(config, shape)
    except ValueError as e:  # ConfigError is a ValueError
        return str(e)
    return None


def _layers_axis() -> str:
    """The registered axis that splits the layers (stage), for the message's example."""
    return axes.of_role(dict.fromkeys(axes.names(), 1), "layers")[0]


def require(config, shape: dict[str, int]) -> None:
    data, stage = axes.num_replicas(shape), axes.num_stages(shape)
    check(
        axes.stage_axis(shape) is not None,
        f"strategy=pipeline needs a stage axis, but mesh_axes is {tuple(shape)}; add one, "
        "e.g. --config.mesh_axes='(" + ",".join(f'"{a}"' for a in (*shape, _layers_axis())) + ")'",
    )
    micro = config.pipeline.num_microbatches
    schedule, v = config.pipeline.schedule, config.pipeline.virtual_stages
    if micro == 0:  # auto: run_setup.setup chooses among the counts these checks accept
        micro = stage if schedule in ("interleaved", "zb-v") else 1
    check(
        not config.model.get("dropout", False),
        _no_dropout("set --config.model.dropout=False or"),
    )
    check(
        config.sync.impl == "shard_map",
        "pipeline stages run with sync.impl=shard_map; pmap is data-parallel only",
    )
    check(
        schedule != "naive" or micro == 1,
        f"pipeline.schedule=naive runs one micro-batch but num_microbatches={micro}; "
        "set --config.pipeline.num_microbatches=1 or use gpipe or 1f1b",
    )
    check(
        v == 1 or schedule == "interleaved",
        f"pipeline.virtual_stages={v} needs pipeline.schedule=interleaved",
    )
    check(
        v == 1 or micro % stage == 0,
        f"pipeline.schedule=interleaved with virtual_stages={v} needs num_microbatches a "
        f"multiple of the {stage} stages (Megatron's rule); got {micro}",
    )
    check(
        schedule not in ("zb-h1", "zb-v") or not config.pipeline.remat,
        f"pipeline.schedule={schedule} splits the backward over stored residuals; "
        "set --config.pipeline.remat=False",
    )
    check(
        schedule != "zb-v" or micro % stage == 0,
        f"pipeline.schedule=zb-v runs micro-batches in groups of the {stage} stages: "
        f"num_microbatches must be a multiple of {stage} (a short group idles and stores "
        f"more); got {micro}",
    )
    eval_bs = config.eval_batch_size or config.global_batch_size
    for key, size in (
        ("global_batch_size", config.global_batch_size),
        ("eval_batch_size", eval_bs),
    ):
        check(
            size % (data * micro) == 0,
            f"{key} {size} must divide into {micro} micro-batches of a multiple of "
            f"{data} (the data replicas); use a multiple of {data * micro}",
        )


def _no_dropout(what: str) -> str:
    """The one line refusing dropout under stages, `what` saying where it comes from."""
    return (
        f"pipeline stages do not draw dropout masks yet: {what} use a mesh without stages "
        "(data and tensor parallelism run dropout)"
    )
