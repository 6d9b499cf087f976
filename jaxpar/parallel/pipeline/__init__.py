"""Layer-wise (pipeline) partitioning over the stage axis: one program per chunk (MPMD).

VGG's stages differ in shape (channels 64..512, resolution 32..1), so instead of the stacked,
padded SPMD carrier, each chunk of layers is compiled for its own stage's slice of the mesh,
the devices at index s of the stage axis (every other axis, data, fsdp, tensor..., still
applies inside a stage). A chunk's parameters and optimizer state live only on its devices,
unpadded, laid out by the chunk's own sync rule: every sync mode runs on stages, each stage's
data replicas following it. The host walks the schedule's events (GPipe, 1F1B, interleaved
1F1B, ZB-H1, ZB-V) in dependency order; JAX's asynchronous dispatch lets stages on different
devices run at the same time. Chunk c lives on device stage `stage_of[c]`
(schedules.placement): c % K, with v chunks per stage under the interleaved schedule and one
otherwise, or ZB-V's V (stage d holds chunks d and 2K-1-d).

The package: `strategy` (the Pipeline strategy: chunks built and placed, state, batches,
steps), `accounting` (what a step runs and moves: programs, boundary and stored bytes, the
stage table), `layout` (a chunk's placed state), `chunks` (a chunk's programs, from a small
description), `shapes` (what each program takes: the one description of its arguments),
`runner` (the event walk and the moves), `transfer` (moves across processes).

`pipeline.remat=True`: backward recomputes the chunk's forward from its stored input, so a
stage keeps one input activation per micro-batch in flight: M under GPipe, at most K - s under
1F1B. `remat=False`: the forward stores the backward's residuals instead (more bytes, no
recomputation), and ZB-H1 and ZB-V split the backward into B (input gradient) and W
(weights).

Several processes (jax.distributed): every process builds the whole mesh and walks the same
events, but runs only the programs of chunks whose stage owns one of its devices (a stage may
span processes: its programs are then SPMD over them); see runner.py and transfer.py.

BatchNorm policy: statistics per micro-batch (over the micro-batch on all data replicas), and
the running averages are updated once per micro-batch, in micro-batch order. With one
micro-batch this is the single-device step; with BatchNorm off any M is.
"""

from jaxpar.parallel.pipeline.strategy import Pipeline, PipelineState

__all__ = ["Pipeline", "PipelineState"]
