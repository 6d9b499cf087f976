"""`spatial`: a CNN's feature maps split by rows over devices (spatial partitioning).

Each device holds a band of rows of every feature map (height / s of them, s = the axis'
size); parameters stay whole on every device, as under data parallelism. A convolution or a
pool whose window crosses a band border first receives the rows it needs from its neighbours
(the halo), so every layer computes exactly the single-device function. BatchNorm's
statistics are sums over the whole map (a few bytes per channel, all-reduced over the axis),
and the weight gradients, summed over every row, are all-reduced over the axis as a data
axis' are: spatial partitioning cuts activation memory by s, not gradient traffic.

**Mechanism: XLA's SPMD partitioner, not hand-written halos.** `spatial` is a rules axis: it
adds the rule ("height", "spatial") (`rules`), every convolutional layer's output (and input)
is pinned to (batch, height, width, channels) with its rows over the axis (models'
`out_axes`), and XLA partitions each windowed op (convolution, max and average pool, their
gradients) with halo exchanges: collective-permutes to the neighbours. In the forward they
are exactly the rows the windows reach (`Window.halo`; tests/test_spatial.py holds the
compiled forward program to it). The alternative, explicit `ppermute` halos in shard_map, was
measured against it on one layer (`python benchmarks/spatial_halo.py`: a 3x3 convolution and
a 3x3 stride-2 max-pool on 4 bands of a map, both equal to one device; the figures are in
docs/results.md, "Spatial partitioning"): the hand-written step moves fewer bytes (the
partitioner sends the convolution's input halo again for the kernel's gradient and 9 padded
rows for the max-pool's gradient, where 1 would do) and is about as fast on this CPU. The
partitioner is used anyway, for coverage: it is exact on every windowed op of every block
(stride-2 and 7x7/11x11 stems, VALID padding, Inception's 1x7/7x1 kernels, average pools that
count padding, the max-pool's gradient) and composes with the tensor axis on the same
activations, where hand-written halos would restate each op's window arithmetic and its
transpose per block kind. The price, the backward's extra halo bytes, is in every figure
jaxpar reports (they are read from the compiled program), and a hand-written exchange of the
max-pool gradient is the first thing to replace if halos ever dominate a step. The image
enters whole on each device and is sliced; the first convolution still receives its halo
from the neighbours, as the partitioner does it.

**Height only, not width.** A band of rows is contiguous in memory (NHWC), keeps a halo to two
neighbours, and a 2-D tiling's gain (halos on four sides, of shorter edges) pays only when
the bands grow thinner than a few kernels; CNN maps shrink by 2 per stage, so the rows run out
within a stage or two either way. Width could be added as a second axis with a "width" rule.

**Where it stops.** A layer is split while every windowed op in it has an input and output
height that divide by s and a halo no deeper than a band. From the first layer that fails
(a 7x7 map on 2 devices, a 4-row band under a 7x7 kernel) the maps are joined: the previous
layer's output is all-gathered and the rest of the network runs on the whole map (the dense
head always does). `--explain` prints the table; a model whose first layer cannot split is
refused in one line before compiling.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from jaxpar.axes.base import Axis, get, register
from jaxpar.models.blocks import equations
from jaxpar.models.trace import traced

WINDOWED = (
    "conv_general_dilated",
    "reduce_window_max",
    "reduce_window_sum",
    "reduce_window_min",
    "reduce_window",
)


@dataclasses.dataclass(frozen=True)
class Window:
    """One windowed op of a layer along the rows: what its halo depends on."""

    op: str
    height: int  # input rows
    out_height: int
    width: int  # input columns
    channels: int  # input channels
    kernel: int  # rows the window spans (dilated)
    stride: int
    pad: int  # rows of padding above the map

    def halo(self, s: int) -> tuple[int, int] | None:
        """Rows a device receives from its upper and lower neighbours (the most any device
        does), or None where the op does not split evenly over s devices."""
        if self.height % s or self.out_height % s:
            return None
        bi, bo = self.height // s, self.out_height // s
        up = down = 0
        for j in range(s):
            first = j * bo * self.stride - self.pad  # first input row device j's outputs read
            last = ((j + 1) * bo - 1) * self.stride - self.pad + self.kernel - 1
            if j > 0:
                up = max(up, j * bi - first)
            if j < s - 1:
                down = max(down, last - ((j + 1) * bi - 1))
        return up, down


def _windows(jaxpr) -> list[Window]:
    found = []
    for eqn in equations(jaxpr):
        name = eqn.primitive.name
        if name == "conv_general_dilated":
            lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
            dn = eqn.params["dimension_numbers"]
            h, w, c = dn.lhs_spec[2], dn.lhs_spec[3], dn.lhs_spec[1]
            k = (rhs[dn.rhs_spec[2]] - 1) * eqn.params["rhs_dilation"][0] + 1
            out = eqn.outvars[0].aval.shape[dn.out_spec[2]]
            found.append(
                Window(
                    "conv",
                    lhs[h],
                    out,
                    lhs[w],
                    lhs[c],
                    k,
                    eqn.params["window_strides"][0],
                    eqn.params["padding"][0][0],
                )
            )
        elif name in WINDOWED:
            shape = eqn.invars[0].aval.shape
            p = eqn.params
            k = (p["window_dimensions"][1] - 1) * p["window_dilation"][1] + 1
            if k > 1 or p["window_strides"][1] > 1:
                found.append(
                    Window(
                        "pool",
                        shape[1],
                        eqn.outvars[0].aval.shape[1],
                        shape[2],
                        shape[3],
                        k,
                        p["window_strides"][1],
                        p["padding"][1][0],
                    )
                )
    return found


@functools.lru_cache(maxsize=512)
def windows(layer) -> tuple[Window, ...]:
    """The windowed ops of one layer (convolutions and pools whose window or stride spans
    rows), traced from its forward program on one example."""
    return tuple(_windows(traced(layer.module, layer.in_shape).jaxpr.jaxpr))


@dataclasses.dataclass(frozen=True)
class LayerSplit:
    """How one layer runs under a spatial split."""

    name: str
    height: int  # rows of its input map (0: not a map)
    split: bool  # computed on bands (else on the whole map)
    gathers: bool  # the first layer on the whole map: its input is all-gathered
    # Rows (elements per example) a device between two neighbours receives in the forward,
    # its windowed ops summed (one on the edge receives its one neighbour's share).
    halo_rows: int
    halo_elements: int
    why: str = ""  # why the split stops here (the first layer not split)


def _problem(layer, s: int) -> tuple[str, int, int]:
    """(why the layer cannot run on bands, or "", halo rows, halo elements per example). A
    user's flax module that pins its own maps' rows (nn.with_logical_constraint to "height",
    models/flax_module.py) runs on bands inside itself, whatever its input and output."""
    if "height" not in layer.activation_names and (
        len(layer.in_shape) != 3 or len(layer.out_shape) != 3
    ):
        return "not a feature map", 0, 0
    rows = elements = 0
    for w in windows(layer):
        halo = w.halo(s)
        if halo is None:
            bad = w.height if w.height % s else w.out_height
            return (
                (
                    f"a {w.op} {'reads' if bad == w.height else 'writes'} {bad} rows, which do "
                    f"not divide over {s} devices"
                ),
                0,
                0,
            )
        band = w.height // s
        if max(halo) > band:
            return (
                (
                    f"its {w.kernel}-row {w.op} window reaches {max(halo)} rows past a band of "
                    f"{band}"
                ),
                0,
                0,
            )
        rows += sum(halo)
        elements += sum(halo) * w.width * w.channels
    return "", rows, elements


def plan(model, s: int) -> tuple[LayerSplit, ...]:
    """Every layer's split over `s` devices: layers run on bands up to the first that cannot
    (a map that does not divide, a band thinner than a window's reach, the dense head), whose
    input is gathered; it and the rest run on the whole map."""
    out, stopped = [], False
    for layer in model.layers:
        why, rows, elements = ("", 0, 0) if stopped else _problem(layer, s)
        height = layer.in_shape[0] if len(layer.in_shape) == 3 else 0
        gathers = bool(why) and not stopped
        stopped = stopped or bool(why)
        out.append(LayerSplit(layer.name, height, not stopped, gathers, rows, elements, why))
    return tuple(out)


class Spatial(Axis):
    def check(self, config, sizes, model=None):
        if sizes[self.name] > 1 and config.sync.impl != "shard_map":
            return f"the {self.name} axis needs sync.impl=shard_map; pmap is data-parallel only"
        if model is None:
            return None
        s = sizes[self.name]
        first = plan(model, s)[0]
        if not first.split:
            h = model.input_shape[0]
            return (
                f"spatial={s} cannot split {model.name}'s first layer {first.name} "
                f"({h}-row input): {first.why}; use a spatial size that divides the map "
                "into bands at least as deep as its windows reach, or another axis"
            )
        return None

    def joins(self, sizes, model):
        return frozenset(x.name for x in plan(model, sizes[self.name]) if not x.split)

    def describe(self, config, sizes, model):
        s = sizes[self.name]
        itemsize = np.dtype(config.model.get("dtype", "float32")).itemsize
        per_device = config.global_batch_size
        for a, n in sizes.items():
            if a != self.name and _batch_axis(a):
                per_device //= n
        rows = [
            (
                f"spatial split over {s} (rows of each map; halo: rows a device between "
                f"two neighbours receives, forward; bytes for this device's {per_device} "
                "images, the backward sends its gradient back):"
            ),
            (
                f"  {'layer':<12} {'input rows':>10} {'band':>6} {'halo rows':>9} "
                f"{'halo bytes':>12}  runs on"
            ),
        ]
        for x in plan(model, s):
            where = "bands" if x.split else "whole map" + (", input gathered" if x.gathers else "")
            if x.why:
                where += f" ({x.why})"
            band = str(x.height // s) if x.split else "-"
            nbytes = x.halo_elements * itemsize * per_device
            rows.append(
                f"  {x.name:<12} {x.height or '-':>10} {band:>6} {x.halo_rows:>9} "
                f"{nbytes:>12,}  {where}"
            )
        return "\n".join(rows)


def _batch_axis(name: str) -> bool:
    return get(name).role == "batch"


SPATIAL = register(
    Spatial(
        "spatial",
        "rules",
        "rows of every feature map (halos exchanged at band borders)",
        word="spatial",
        phrase="spatial over {n}",
        rules=(("height", "spatial"),),
        sums_gradients=True,
    )
)
