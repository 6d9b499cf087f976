"""`stage`: layer-wise (pipeline) partitioning. The layers are cut into consecutive stages,
one per index of the axis; stage s runs on the mesh's slice at index s, where the other axes
still apply (jaxpar/parallel/pipeline/)."""

from __future__ import annotations

from jaxpar.axes.base import Axis, register

STAGE = register(
    Axis(
        "stage",
        "layers",
        "the layers, cut into consecutive pipeline stages",
        word="pipeline",
        phrase="pipeline over {n} stages",
    )
)
