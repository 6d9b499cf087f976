"""What a pipeline run needs of its config, checked before anything is built (one line each)."""

from __future__ import annotations

from jaxpar.config import check


def problem(config, shape: tuple[int, int, int]) -> str | None:
    """Why a pipeline cannot run `config` on the (data, stage, tensor) mesh `shape`, or None."""
    try:
        require(config, shape)
    except ValueError as e:  # ConfigError is a ValueError
        return str(e)
    return None


def require(config, shape: tuple[int, int, int]) -> None:
    data, stage, _ = shape
    micro = config.pipeline.num_microbatches
    schedule, v = config.pipeline.schedule, config.pipeline.virtual_stages
    if micro == 0:  # auto: trainer.setup chooses among the counts these checks accept
        micro = stage if schedule in ("interleaved", "zb-v") else 1
    check(
        not config.model.get("dropout", False),
        "pipeline stages do not draw dropout masks yet; set --config.model.dropout=False or "
        "use a mesh without stages (data and tensor parallelism run dropout)",
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
            f"{data} (the data axis); use a multiple of {data * micro}",
        )
