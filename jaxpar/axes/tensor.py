"""`tensor`: channel (tensor) partitioning. Variables and activations are laid out by the
sharding rules (`tensor.rules`: logical dimension names such as conv_out and mlp -> this axis)
and XLA's SPMD partitioner inserts the collectives between layers (jaxpar/parallel/tensor.py).
A rules axis: any other axis of role "rules" that the rules name works the same way."""

from __future__ import annotations

from jaxpar.axes.base import Axis, register

TENSOR = register(
    Axis(
        "tensor",
        "rules",
        "channels of variables and activations, by tensor.rules",
        word="tensor",
        phrase="tensor parallel over {n}",
    )
)
