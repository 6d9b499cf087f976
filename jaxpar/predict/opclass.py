"""What a compiled program does, by operation class, read from its optimized HLO text.

One efficiency number per profile does not carry from one model to another: convolutions and
matrix products run near the device's peak, while BatchNorm, ReLU, pooling, casts and the
optimizer update are limited by memory bandwidth, and every kernel the program launches costs
a fixed time however small it is. So a program is summarised as

    conv3x3_flops  FLOPs of its 3x3 (and 5x5) stride-1 convolutions and their gradients
                   (2 x MACs, from their shapes): what cuDNN runs as Winograd transforms,
                   faster than their FLOP count says
    matmul_flops   FLOPs of its other convolutions and its dot products
    memory_bytes   bytes read and written by every other kernel (operands + result; an
                   elementwise or transposing kernel reads at most its result's elements of
                   each operand: kernel_bytes)
    kernels        top-level operations that run as a kernel (fusions, convolutions, dots,
                   copies, collectives; not parameters, constants, tuples or bitcasts)

and priced by the profile (`Profile.program_time`): the matmul classes at calibrated
fractions of peak, the memory-bound bytes at the memory bandwidth, a device time per kernel,
and a host time per kernel launched (the step takes the longer of host and device). The
figures are exact for the program compiled here; a GPU compiler fuses differently, which
gpufusion.py models (the profile's `compiler`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing

from jaxpar import hlo

# Instructions that launch nothing: they name, pack or unpack buffers.
_FREE = {
    "parameter",
    "constant",
    "tuple",
    "get-tuple-element",
    "bitcast",
    "after-all",
    "partition-id",
    "replica-id",
    "iota",
}
_CONTROL = {"while", "call", "conditional"}  # their bodies' kernels count, not themselves
_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.+?)\s([a-z][a-z0-9\-]*)\((.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?([%\w.\-, ]+)\}?")
_DIMS = re.compile(r"\[([\d,]*)\]")


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


@dataclasses.dataclass(frozen=True)
class OpClasses:
    """One call of one program, per device."""

    matmul_flops: float = 0.0
    conv3x3_flops: float = 0.0
    memory_bytes: float = 0.0
    kernels: int = 0
    # every matrix kernel (Matmul: FLOPs, bytes, Winograd, narrowest GEMM dimension, thin
    # input), for a roofline on a GPU
    matmuls: tuple[Matmul, ...] = ()
    # the memory-bound kernels by class (MEMORY_CLASSES), as (class, bytes, kernels), sorted;
    # the CPU's program's from its kernels (memory_class), the modelled GPU program's from
    # gpufusion; a GPU profile prices each class at its own costs (memory_kernel_costs)
    memory_classes: tuple[tuple[str, float, int], ...] = ()
    # the reduce_few kernels' bytes per result, summed: what one of their lanes moves (XLA:GPU
    # spreads such a kernel over its results alone, so its time is this at one lane's rate)
    lane_bytes: float = 0.0

    def __add__(self, other: OpClasses) -> OpClasses:
        return OpClasses(
            self.matmul_flops + other.matmul_flops,
            self.conv3x3_flops + other.conv3x3_flops,
            self.memory_bytes + other.memory_bytes,
            self.kernels + other.kernels,
            self.matmuls + other.matmuls,
            _merge(self.memory_classes, other.memory_classes),
            self.lane_bytes + other.lane_bytes,
        )

    @property
    def flops(self) -> float:
        return self.matmul_flops + self.conv3x3_flops


# Classes of memory-bound GPU kernels, whose costs differ on the same bytes (measured in an
# H100's kernel traces, docs/predict.md): a reduction (BatchNorm's statistics, a bias
# gradient), a reduction into few results (reduce_few: fewer than FEW_RESULTS, each summing at
# least FEW_LENGTH elements, which XLA:GPU spreads over its results alone, so that its rate is
# its results times one lane's: OpClasses.lane_bytes), a transpose (a weight into cuDNN's layout), a window (pooling and
# its gradient: each input read by several outputs), and everything else elementwise.
# On a CPU, generate: an elementwise kernel that writes an array of GENERATES or more times
# the bytes it reads (XLA:CPU's iotas and broadcasts of the max-pool gradients), which runs at
# a rate of its own there (cpu_class).
MEMORY_CLASSES = ("elementwise", "reduce", "reduce_few", "transpose", "window", "generate")
# The classes a profile that does not name one prices it as (reduce_few came later: a profile
# written before it keeps pricing those kernels as reductions)
CLASS_FALLBACK = {"reduce_few": "reduce", "generate": "elementwise"}
GENERATES = 16
FEW_RESULTS = 1024
FEW_LENGTH = 256


def reduction_class(results: int, length: int) -> str:
    """A reduction kernel's class from its results and the elements summed into each."""
    return "reduce_few" if results < FEW_RESULTS and length >= FEW_LENGTH else "reduce"


def _merge(a: tuple, b: tuple) -> tuple:
    if not a or not b:
        return a or b
    total: dict[str, list] = {}
    for name, nbytes, kernels in a + b:
        t = total.setdefault(name, [0.0, 0])
        t[0] += nbytes
        t[1] += kernels
    return tuple((name, t[0], t[1]) for name, t in sorted(total.items()))


def _computations(text: str) -> dict[str, list[tuple[str, str, str, str]]]:
    """{computation name: [(name, result type, opcode, rest of line)]}; the entry as "ENTRY"."""
    comps: dict[str, list] = {}
    current = None
    for line in text.splitlines():
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            head = _HEAD.match(line)
            if head:
                current = "ENTRY" if head.group(1) else head.group(2)
                comps[current] = []
                continue
        if line.startswith("}"):
            current = None
            continue
        if current is not None:
            m = _INSTR.match(line)
            if m:
                comps[current].append(m.groups())
    return comps


def _elements(type_text: str) -> int:
    dims = _DIMS.search(type_text)
    if not dims:
        return 1
    return math.prod(int(d) for d in dims.group(1).split(",") if d)


def _dims(type_text: str) -> list[int]:
    dims = _DIMS.search(type_text)
    return [int(d) for d in dims.group(1).split(",") if d] if dims else []


def _operands(rest: str) -> list[str]:
    """Operand names of an instruction (the text up to its closing parenthesis)."""
    depth, end = 1, len(rest)
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            end = i
            break
    return _OPERAND.findall(rest[:end])


_WINOGRAD = {"3", "5"}  # window sides cuDNN's Winograd kernels take (3x3, and 5x5 non-fused)


def _winograd(result: str, rest: str) -> bool:
    """A 3x3 or 5x5 stride-1 convolution, its input gradient (also a stride-1 convolution of
    that window) or its weight gradient (a convolution whose result has those spatial
    dimensions): what cuDNN runs as Winograd transforms. No strides, dilations or feature
    groups."""
    if re.search(r"stride=|lhs_dilate=|rhs_dilate=|feature_group_count=[02-9]", rest):
        return False
    window = re.search(r"window=\{size=(\d+)x(\d+)\b", rest)
    if not window:
        return False
    if window.group(1) == window.group(2) in _WINOGRAD:
        return True
    labels = re.search(r"dim_labels=\w+_\w+->(\w+)", rest)
    dims = _dims(result)
    if not labels or len(labels.group(1)) != len(dims) or len(dims) != 4:
        return False
    out = labels.group(1)
    side = dims[out.index("0")], dims[out.index("1")]
    return side[0] == side[1] and str(side[0]) in _WINOGRAD


def _matmul(op: str, result: str, rest: str, types: dict[str, str]) -> OpClasses:
    flops = _matmul_flops(op, result, rest, types)
    moved = float(
        hlo.shape_bytes(result)
        + sum(hlo.shape_bytes(types[a]) for a in _operands(rest) if a in types)
    )
    narrow, thin = _narrow(op, result, rest, types), _thin(op, result, rest, types)
    tile = _tile(op, result, rest, types) if op == "convolution" else narrow
    keys = conv_keys(result, rest, types) if op == "convolution" else ()
    if op == "convolution" and _winograd(result, rest):
        return OpClasses(
            conv3x3_flops=flops, matmuls=(Matmul(flops, moved, True, narrow, thin, tile, keys),)
        )
    return OpClasses(
        matmul_flops=flops, matmuls=(Matmul(flops, moved, False, narrow, thin, tile, keys),)
    )


KINDS = ("forward", "input gradient", "filter gradient")


def conv_keys(result: str, rest: str, types: dict[str, str]) -> tuple:
    """The layers and views a 2-D convolution of a training step may be, as (N, H, W, C, K,
    R, S, stride_h, stride_w, P, Q, kind): the layer's batch, input map, input and output
    features, window, strides and output map, and which of its three kernels this is. A
    weight gradient's result is the kernel (its window the output map, dilated by the
    stride); an input gradient of a strided layer dilates its input (the output's gradient)
    by the stride; a stride-1 input gradient looks like a forward convolution, so both are
    given, the forward first. () where it is none of these (grouped, 1-D, ...)."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", rest)
    window = re.search(r"window=\{([^}]*)\}", rest)
    args = _operands(rest)
    if (
        not labels
        or not window
        or len(args) < 2
        or args[0] not in types
        or re.search(r"feature_group_count=[02-9]|batch_group_count=[02-9]", rest)
    ):
        return ()
    lhs, out = _dims(types[args[0]]), _dims(result)
    ll, _, ol = labels.groups()
    if len(lhs) != 4 or len(out) != 4 or len(ll) != 4 or len(ol) != 4:
        return ()

    def field(name: str) -> tuple[int, int]:
        found = re.search(rf"\b{name}=(\d+)x(\d+)", window.group(1))
        return (int(found.group(1)), int(found.group(2))) if found else (1, 1)

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


def _thin(op: str, result: str, rest: str, types: dict[str, str]) -> bool:
    """A convolution over fewer than THIN input features: the first layer on an image (its
    input's features, "f" in the input's labels), or that layer's weight gradient (a
    convolution whose result is the kernel, its window the output map, and whose result's
    "b" is the layer's input features)."""
    labels = re.search(r"dim_labels=(\w+)_\w+->(\w+)", rest)
    window = re.search(r"window=\{size=([\dx]+)", rest)
    args = _operands(rest)
    if op != "convolution" or not labels or not window or not args or args[0] not in types:
        return False
    lhs, out = _dims(types[args[0]]), _dims(result)
    lhs_labels, out_labels = labels.groups()
    if len(lhs) != len(lhs_labels) or len(out) != len(out_labels):
        return False
    area = math.prod(int(d) for d in window.group(1).split("x"))
    spatial = math.prod(out[i] for i, c in enumerate(out_labels) if c.isdigit())
    if area > spatial:  # a weight gradient: its result is the kernel
        return out[out_labels.index("b")] < THIN
    return lhs[lhs_labels.index("f")] < THIN


def _tile(op: str, result: str, rest: str, types: dict[str, str]) -> int:
    """A convolution's fewest of output rows, input features and output features (Matmul.tile):
    its result's features and rows and its kernel operand's input features; a weight gradient
    (its result the kernel, as `_thin` tells) has the layer's features in its result ("b" and
    "f") and sums over the batch's positions."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", rest)
    window = re.search(r"window=\{size=([\dx]+)", rest)
    args = _operands(rest)
    out = _dims(result)
    if not labels or not window or len(args) < 2 or args[1] not in types:
        return 1 << 30
    kernel = _dims(types[args[1]])
    _, k_labels, out_labels = labels.groups()
    if len(kernel) != len(k_labels) or len(out) != len(out_labels):
        return 1 << 30
    area = math.prod(int(d) for d in window.group(1).split("x"))
    positions = math.prod(out[i] for i, c in enumerate(out_labels) if c.isdigit())
    if area > positions:  # a weight gradient: rows are the summed batch x positions
        rows = math.prod(kernel) // max(kernel[k_labels.index("o")], 1)
        return max(1, min(rows, out[out_labels.index("b")], out[out_labels.index("f")]))
    rows = math.prod(out) // max(out[out_labels.index("f")], 1)
    return max(1, min(rows, out[out_labels.index("f")], kernel[k_labels.index("i")]))


def _narrow(op: str, result: str, rest: str, types: dict[str, str]) -> int:
    """The narrowest dimension of the matrix product a convolution or dot is (M: output rows,
    N: output features, K: products summed per output): a GPU's tiles are 64-128 wide in each,
    so a narrow one wastes part of every tile."""
    args = _operands(rest)
    out = _dims(result)
    if not out or len(args) < 2 or args[0] not in types or args[1] not in types:
        return 1 << 30
    if op == "convolution":
        kernel = _dims(types[args[1]])
        labels = re.search(r"dim_labels=\w+_(\w+)->(\w+)", rest)
        if not labels or not kernel or "f" not in labels.group(2):
            return 1 << 30
        n = out[labels.group(2).index("f")]
        k = math.prod(kernel) // max(kernel[labels.group(1).index("o")], 1)
    else:
        lhs = _dims(types[args[0]])
        contract = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
        idx = [int(d) for d in contract.group(1).split(",") if d] if contract else []
        k = math.prod(lhs[i] for i in idx) if idx else 1
        n = out[-1]
    m = math.prod(out) // max(n, 1)
    return max(1, min(m, n, k))


def _matmul_flops(op: str, result: str, rest: str, types: dict[str, str]) -> float:
    """2 x multiply-adds of one convolution or dot, from its result and operand shapes."""
    args = _operands(rest)
    if op == "convolution" and len(args) >= 2 and args[1] in types:
        kernel = _dims(types[args[1]])
        labels = re.search(r"dim_labels=\w+_(\w+)->", rest)
        out_at = labels.group(1).index("o") if labels else len(kernel) - 1
        per_output = math.prod(kernel) // max(kernel[out_at], 1) if kernel else 1
        # an input gradient of a strided convolution dilates its input with zeros: only
        # 1 / prod(dilation) of the window's products are not with a zero
        dilate = re.search(r"lhs_dilate=([\dx]+)", rest)
        zeros = math.prod(int(d) for d in dilate.group(1).split("x")) if dilate else 1
        return 2.0 * _elements(result) * per_output / zeros
    if op == "dot" and args and args[0] in types:
        lhs = _dims(types[args[0]])
        contract = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
        k = math.prod(lhs[int(d)] for d in contract.group(1).split(",") if d) if contract else 1
        return 2.0 * _elements(result) * k
    return 0.0


def _called(rest: str) -> list[str]:
    out = []
    for group in _CALLS.findall(rest):
        out += [name.strip().lstrip("%") for name in group.split(",") if name.strip()]
    return out


def classify(text: str, compiler: str = "cpu") -> OpClasses:
    """Op classes of one compiled program (its `as_text()`), per device per call; `compiler`
    "gpu" for an XLA:GPU program (its memory-bound kernels' classes are the GPU's)."""
    comps = _computations(text)
    types = {name: result for body in comps.values() for name, result, _, _ in body}

    def inner(name: str, seen: frozenset = frozenset()) -> OpClasses:
        total = OpClasses()
        for _, result, op, rest in comps.get(name, ()):
            if op in ("convolution", "dot"):
                total = total + _matmul(op, result, rest, types)
            for callee in _called(rest):
                if callee not in seen:
                    total = total + inner(callee, seen | {name})
        return total

    def walk(name: str, seen: frozenset = frozenset()) -> OpClasses:
        out = OpClasses()
        for _, result, op, rest in comps.get(name, ()):
            if op in _FREE or op.removesuffix("-start") in hlo.KINDS or op.endswith("-done"):
                continue  # collectives are priced by their bytes and links, not here
            if op in _CONTROL:
                for callee in _called(rest):
                    if callee not in seen:
                        out = out + walk(callee, seen | {name})
                continue
            if op in ("convolution", "dot"):
                mm = _matmul(op, result, rest, types)
            elif op == "custom-call" and _LIBRARY.search(rest):
                mm = library_call(result, rest, types)
            elif op == "fusion":
                mm = sum((inner(c) for c in _called(rest)), OpClasses())
            else:
                mm = OpClasses()
            if mm.flops:
                out = out + mm + OpClasses(kernels=1)
                continue
            kind, results = memory_class(op, rest, comps)
            kind = cpu_class(kind, result, rest, types) if compiler == "cpu" else kind
            moved = kernel_bytes(result, rest, types, kind)
            lane = moved / results if kind == "reduce_few" else 0.0
            out = out + OpClasses(
                memory_bytes=moved, kernels=1, lane_bytes=lane, memory_classes=((kind, moved, 1),)
            )
        return out

    return walk("ENTRY")


# A cuDNN convolution or a cuBLAS matrix product in an XLA:GPU program (a custom call).
_LIBRARY = re.compile(r'custom_call_target="__(cudnn\$conv\w*|cublas\$[\w$]*)"')
_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')


def library_call(result: str, rest: str, types: dict[str, str]) -> OpClasses:
    """A cuDNN convolution or cuBLAS product of an XLA:GPU program, as one matrix kernel.

    XLA:GPU writes each of a convolution's three kernels with the forward convolution's window
    and dimension labels: the forward reads (x, w) and writes y, the input gradient reads (dy,
    w) and writes dx, the weight gradient reads (x, dy) and writes dw. So x, w and y are found
    by the kernel's kind, and each kernel does the forward's multiply-adds."""
    target = _LIBRARY.search(rest).group(1)
    args = [a for a in _operands(rest) if a in types]
    arrays = [types[a] for a in args]
    out = _arrays(result)[0]  # cuDNN and cuBLAS return (result, scratch)
    moved = float(hlo.shape_bytes(out) + sum(hlo.shape_bytes(t) for t in arrays))
    if target.startswith("cublas"):
        contract = _CONTRACTING.search(rest)
        lhs = _dims(arrays[0]) if arrays else []
        idx = [int(d.strip('"')) for d in contract.group(1).split(",") if d] if contract else []
        k = math.prod(lhs[i] for i in idx) if idx else 1
        n, flops = (_dims(out) or [1])[-1], 2.0 * _elements(out) * k
        narrow = max(1, min(_elements(out) // max(n, 1), n, k))
        return OpClasses(
            matmul_flops=flops, matmuls=(Matmul(flops, moved, False, narrow, tile=narrow),)
        )
    if len(arrays) < 2:
        return OpClasses()
    kind = (
        "input gradient"
        if "BackwardInput" in target
        else "filter gradient"
        if "BackwardFilter" in target
        else "forward"
    )
    x, w, y = {
        "forward": (arrays[0], arrays[1], out),
        "input gradient": (out, arrays[1], arrays[0]),
        "filter gradient": (arrays[0], out, arrays[1]),
    }[kind]
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", rest)
    window = re.search(r"window=\{([^}]*)\}", rest)
    xd, wd, yd = _dims(x), _dims(w), _dims(y)
    if not labels or not window or len(xd) != 4 or len(wd) != 4 or len(yd) != 4:
        return OpClasses()
    xl, wl, yl = labels.groups()

    def field(name: str) -> tuple[int, int]:
        found = re.search(rf"\b{name}=(\d+)x(\d+)", window.group(1))
        return (int(found.group(1)), int(found.group(2))) if found else (1, 1)

    n, c, k = xd[xl.index("b")], xd[xl.index("f")], yd[yl.index("f")]
    h, wide, p, q = xd[xl.index("0")], xd[xl.index("1")], yd[yl.index("0")], yd[yl.index("1")]
    r, s = field("size")
    stride = field("stride")
    per_output = math.prod(wd) // max(wd[wl.index("o")], 1)  # r x s x c / groups
    flops = 2.0 * math.prod(yd) * per_output
    grouped = per_output != r * s * c
    winograd = (
        r == s
        and str(r) in _WINOGRAD
        and stride == (1, 1)
        and not grouped
        and not re.search(r"lhs_dilate=|rhs_dilate=", rest)
    )
    rows = n * h * wide if kind == "input gradient" else n * p * q
    gemm = {
        "forward": (rows, k, per_output),
        "input gradient": (rows, c, k * r * s),
        "filter gradient": (per_output, k, rows),
    }[kind]
    thin = c < THIN and kind != "input gradient"
    key = (n, h, wide, c, k, r, s, *stride, p, q, kind)
    mm = Matmul(flops, moved, winograd, max(1, min(gemm)), thin, max(1, min(rows, c, k)), (key,))
    if winograd:
        return OpClasses(conv3x3_flops=flops, matmuls=(mm,))
    return OpClasses(matmul_flops=flops, matmuls=(mm,))


def kernel_bytes(result: str, rest: str, types: dict[str, str], kind: str) -> float:
    """Bytes a memory-bound kernel moves: its result and its operands, where an elementwise or
    transposing kernel reads at most one element of an operand per element of its result (a
    slice of a concatenation's gradient reads the slice, not the whole operand; XLA computes a
    loop fusion's expression at its result's indices only). Reductions and windows read whole
    operands."""
    out = hlo.shape_bytes(result)
    each = max((math.prod(d) if (d := _dims(t)) else 1 for t in _arrays(result)), default=1)
    total = float(out)
    for a in set(_operands(rest)):
        if a not in types:
            continue
        size = hlo.shape_bytes(types[a])
        if kind in ("elementwise", "transpose") and size:
            elements = max(_elements(types[a]), 1)
            size = min(size, each * size // elements)
        total += size
    return total


def cpu_class(kind: str, result: str, rest: str, types: dict[str, str]) -> str:
    """A CPU kernel's class: `kind` (memory_class), or generate where an elementwise kernel
    writes GENERATES or more times the bytes it reads (MEMORY_CLASSES)."""
    if kind != "elementwise":
        return kind
    reads = sum(hlo.shape_bytes(types[a]) for a in set(_operands(rest)) if a in types)
    return "generate" if reads * GENERATES <= hlo.shape_bytes(result) else kind


def _arrays(type_text: str) -> list[str]:
    """The array types in an HLO type (one, or a tuple's elements)."""
    return re.findall(r"[a-z]+\d*\[[\d,]*\]", type_text)


def memory_class(op: str, rest: str, comps: dict) -> tuple[str, int]:
    """A memory-bound kernel's class (MEMORY_CLASSES) from what its instruction (`op`, the rest
    of its line) holds, with its results where that is reduce_few (else 1): a window (pooling,
    its gradient, a scatter), a transpose (or a reversal), a reduction, or elementwise. The
    same names gpufusion's rule 8 gives the modelled GPU program's kernels."""
    ops, todo = set(), [(op, rest)]
    while todo:
        o, r = todo.pop()
        ops.add(o)
        todo += [(o2, r2) for c in _called(r) for _, _, o2, r2 in comps.get(c, ())]
    if ops & {"reduce-window", "select-and-scatter", "scatter"}:
        return "window", 1
    if ops & {"transpose", "reverse"}:
        return "transpose", 1
    if "reduce" not in ops:
        return "elementwise", 1
    _, results, length, row = largest_reduction(rest, comps)
    if row or results == 1:
        return "reduce", 1
    kind = reduction_class(results, length)
    return kind, results if kind == "reduce_few" else 1


def largest_reduction(rest: str, comps: dict) -> tuple[int, int, int, bool]:
    """(elements read, results, elements summed into each, row) of the largest reduction in the
    computations an instruction (the rest of its line) calls, row when it sums along its
    operand's minor dimension (XLA:GPU's row reduction: a warp or a block per result);
    (0, 1, 1, False) if it holds none."""
    best, todo = (0, 1, 1, False), list(_called(rest))
    while todo:
        body = comps.get(todo.pop(), ())
        types = {n: r for n, r, _, _ in body}
        for _, result, o, r in body:
            todo += _called(r) if o == "fusion" else []
            args = _operands(r)
            if o == "reduce" and args and args[0] in types:
                read, results = _elements(types[args[0]]), max(_elements(result), 1)
                layout = re.search(r"\{([\d,]+)\}", types[args[0]].split("]", 1)[-1])
                dims = re.search(r"dimensions=\{([\d,]*)\}", r)
                minor = layout.group(1).split(",")[0] if layout else None
                row = bool(dims and minor is not None and minor in dims.group(1).split(","))
                best = max(best, (read, results, read // results, row))
    return best
