"""The matrix kernels of a compiled program: a convolution's or a dot's FLOPs, bytes and the
shape figures a GPU's rate depends on (Winograd or not, the narrowest GEMM dimension, a thin
input, its tile width), and a convolution's layer and view as a kernel table names it
(conv_keys). opclass.classify sums them; library.py reads XLA:GPU's cuDNN and cuBLAS calls.
"""

from __future__ import annotations

import math
import typing

from jaxpar import hlo


class Matmul(typing.NamedTuple):
    """One matrix kernel, as a GPU runs it."""

    flops: float
    moved: float  # bytes it reads and writes
    winograd: bool  # a 3x3 or 5x5 stride-1 convolution (or its gradient)
    narrow: int  # its narrowest GEMM dimension
    # a convolution over fewer than THIN channels (an image's 3): tensor-core kernels need
    # channels in multiples of 8, so cuDNN runs it with slow generic kernels
    thin: bool = False
    # its narrowest dimension with a convolution's window taps apart: the fewest of its output
    # rows (batch x positions), input features and output features (a dot's narrowest GEMM
    # dimension). cuDNN's implicit GEMM runs each tap's features through the tensor-core
    # tiles, so a layer of 12 output features fills 12 of a tile's 128 columns in its forward
    # and both gradients alike (hardware.Profile.tile_width)
    tile: int = 1 << 30
    # a convolution's layer and view, as a kernel table names its kernels (conv_keys: (N, H, W,
    # C, K, R, S, stride_h, stride_w, P, Q, kind)), the likeliest first: a profile with that
    # kernel measured prices it at its measured time (Profile.measured_kernels)
    keys: tuple = ()


THIN = 8


WINOGRAD = {"3", "5"}  # window sides cuDNN's Winograd kernels take (3x3, and 5x5 non-fused)


def _winograd(ins: hlo.Instruction) -> bool:
    """A 3x3 or 5x5 stride-1 convolution, its input gradient (also a stride-1 convolution of
    that window) or its weight gradient (a convolution whose result has those spatial
    dimensions): what cuDNN runs as Winograd transforms. No strides, dilations or feature
    groups."""
    window, labels, dims = ins.window(), ins.dim_labels(), hlo.dims(ins.type)
    if {"stride", "lhs_dilate", "rhs_dilate"} & window.keys() or _groups(ins, "feature"):
        return False
    if len(size := window.get("size", ())) != 2:
        return False
    if size[0] == size[1] and str(size[0]) in WINOGRAD:
        return True
    if not labels or len(labels[2]) != len(dims) or len(dims) != 4:
        return False
    side = dims[labels[2].index("0")], dims[labels[2].index("1")]
    return side[0] == side[1] and str(side[0]) in WINOGRAD


def _groups(ins: hlo.Instruction, *kinds: str) -> bool:
    """Whether a convolution has groups of any of `kinds` ("feature", "batch")."""
    return any(int(ins.attribute(f"{kind}_group_count") or 1) != 1 for kind in kinds)


def matmul(ins: hlo.Instruction, types: dict[str, str]) -> Matmul:
    """One convolution or dot instruction as a matrix kernel; `types`: the program's result
    types by name."""
    flops, conv = _matmul_flops(ins, types), ins.opcode == "convolution"
    moved = float(
        hlo.shape_bytes(ins.type)
        + sum(hlo.shape_bytes(types[a]) for a in ins.operands if a in types)
    )
    narrow, thin = _narrow(ins, types), _thin(ins, types)
    tile = _tile(ins, types) if conv else narrow
    keys = conv_keys(ins, types) if conv else ()
    winograd = conv and _winograd(ins)
    return Matmul(flops, moved, winograd, narrow, thin, tile, keys)


KINDS = ("forward", "input gradient", "filter gradient")


def conv_keys(ins: hlo.Instruction, types: dict[str, str]) -> tuple:
    """The layers and views a 2-D convolution of a training step may be, as (N, H, W, C, K,
    R, S, stride_h, stride_w, P, Q, kind): the layer's batch, input map, input and output
    features, window, strides and output map, and which of its three kernels this is. A
    weight gradient's result is the kernel (its window the output map, dilated by the
    stride); an input gradient of a strided layer dilates its input (the output's gradient)
    by the stride; a stride-1 input gradient looks like a forward convolution, so both are
    given, the forward first. () where it is none of these (grouped, 1-D, ...)."""
    labels, window, args = ins.dim_labels(), ins.window(), ins.operands
    grouped = _groups(ins, "feature", "batch")
    if grouped or not labels or not window or len(args) < 2 or args[0] not in types:
        return ()
    lhs, out = hlo.dims(types[args[0]]), hlo.dims(ins.type)
    ll, _, ol = labels
    if len(lhs) != 4 or len(out) != 4 or len(ll) != 4 or len(ol) != 4:
        return ()

    def field(name: str) -> tuple[int, ...]:
        return window.get(name, (1, 1))

    def at(dims, lab, key: str) -> int:
        return dims[lab.index(key)]

    size = field("size")
    lmap = (at(lhs, ll, "0"), at(lhs, ll, "1"))
    omap = (at(out, ol, "0"), at(out, ol, "1"))
    if size[0] * size[1] > omap[0] * omap[1]:  # a weight gradient: [C, R, S, K] from x and dy
        return (
            (
                at(lhs, ll, "f"),
                *lmap,
                at(lhs, ll, "b"),
                at(out, ol, "f"),
                *omap,
                *field("rhs_dilate"),
                *size,
                "filter gradient",
            ),
        )
    lhs_dilate = field("lhs_dilate")
    backward = (
        at(out, ol, "b"),
        *omap,
        at(out, ol, "f"),
        at(lhs, ll, "f"),
        *size,
        *lhs_dilate,
        *lmap,
        "input gradient",
    )
    if lhs_dilate != (1, 1):
        return (backward,)
    forward = (
        at(lhs, ll, "b"),
        *lmap,
        at(lhs, ll, "f"),
        at(out, ol, "f"),
        *size,
        *field("stride"),
        *omap,
        "forward",
    )
    return (forward, backward) if field("stride") == (1, 1) else (forward,)


def _thin(ins: hlo.Instruction, types: dict[str, str]) -> bool:
    """A convolution over fewer than THIN input features: the first layer on an image (its
    input's features, "f" in the input's labels), or that layer's weight gradient (a
    convolution whose result is the kernel, its window the output map, and whose result's
    "b" is the layer's input features)."""
    labels, size, args = ins.dim_labels(), ins.window().get("size"), ins.operands
    if ins.opcode != "convolution" or not labels or not size or not args or args[0] not in types:
        return False
    lhs, out = hlo.dims(types[args[0]]), hlo.dims(ins.type)
    lhs_labels, _, out_labels = labels
    if len(lhs) != len(lhs_labels) or len(out) != len(out_labels):
        return False
    area = math.prod(size)
    spatial = math.prod(out[i] for i, c in enumerate(out_labels) if c.isdigit())
    if area > spatial:  # a weight gradient: its result is the kernel
        return out[out_labels.index("b")] < THIN
    return lhs[lhs_labels.index("f")] < THIN


def _tile(ins: hlo.Instruction, types: dict[str, str]) -> int:
    """A convolution's fewest of output rows, input features and output features (Matmul.tile):
    its result's features and rows and its kernel operand's input features; a weight gradient
    (its result the kernel, as `_thin` tells) has the layer's features in its result ("b" and
    "f") and sums over the batch's positions."""
    labels, size, args = ins.dim_labels(), ins.window().get("size"), ins.operands
    out = hlo.dims(ins.type)
    if not labels or not size or len(args) < 2 or args[1] not in types:
        return 1 << 30
    kernel = hlo.dims(types[args[1]])
    _, k_labels, out_labels = labels
    if len(kernel) != len(k_labels) or len(out) != len(out_labels):
        return 1 << 30
    area = math.prod(size)
    positions = math.prod(out[i] for i, c in enumerate(out_labels) if c.isdigit())
    if area > positions:  # a weight gradient: rows are the summed batch x positions
        rows = math.prod(kernel) // max(kernel[k_labels.index("o")], 1)
        return max(1, min(rows, out[out_labels.index("b")], out[out_labels.index("f")]))
    rows = math.prod(out) // max(out[out_labels.index("f")], 1)
    return max(1, min(rows, out[out_labels.index("f")], kernel[k_labels.index("i")]))


def _narrow(ins: hlo.Instruction, types: dict[str, str]) -> int:
    """The narrowest dimension of the matrix product a convolution or dot is (M: output rows,
    N: output features, K: products summed per output): a GPU's tiles are 64-128 wide in each,
    so a narrow one wastes part of every tile."""
    args, out = ins.operands, hlo.dims(ins.type)
    if not out or len(args) < 2 or args[0] not in types or args[1] not in types:
        return 1 << 30
    if ins.opcode == "convolution":
        kernel, labels = hlo.dims(types[args[1]]), ins.dim_labels()
        if not labels or not kernel or "f" not in labels[2]:
            return 1 << 30
        n = out[labels[2].index("f")]
        k = math.prod(kernel) // max(kernel[labels[1].index("o")], 1)
    else:
        lhs = hlo.dims(types[args[0]])
        k, n = math.prod(lhs[i] for i in ins.ints("lhs_contracting_dims")), out[-1]
    m = math.prod(out) // max(n, 1)
    return max(1, min(m, n, k))


def _matmul_flops(ins: hlo.Instruction, types: dict[str, str]) -> float:
    """2 x multiply-adds of one convolution or dot, from its result and operand shapes."""
    args = ins.operands
    if ins.opcode == "convolution" and len(args) >= 2 and args[1] in types:
        kernel, labels = hlo.dims(types[args[1]]), ins.dim_labels()
        out_at = labels[1].index("o") if labels else len(kernel) - 1
        per_output = math.prod(kernel) // max(kernel[out_at], 1) if kernel else 1
        # an input gradient of a strided convolution dilates its input with zeros: only
        # 1 / prod(dilation) of the window's products are not with a zero
        zeros = math.prod(ins.window().get("lhs_dilate", ()))
        return 2.0 * hlo.elements(ins.type) * per_output / zeros
    if ins.opcode == "dot" and args and args[0] in types:
        lhs = hlo.dims(types[args[0]])
        k = math.prod(lhs[i] for i in ins.ints("lhs_contracting_dims"))
        return 2.0 * hlo.elements(ins.type) * k
    return 0.0
