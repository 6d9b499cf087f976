"""`data`: data parallelism. The global batch is split over the axis, every device keeps a
replica of the model (or, by the synchronisation rule, a slice of its state), and the
replicas agree as `sync.mode` says (jaxpar/parallel/sync/). The default axis of every run."""

from __future__ import annotations

from jaxpar.axes.base import Axis, register

DATA = register(
    Axis(
        "data",
        "batch",
        "the global batch, one share per device; replicas agree by sync.mode",
        word="data",
        phrase="data parallel over {n}",
    )
)
