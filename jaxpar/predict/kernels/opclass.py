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
figures are exact for the program compiled here (XLA:CPU's, or XLA:GPU's compiled for the
profile's target). The program is read by jaxpar.hlo; its matrix kernels by matrix.py, and
XLA:GPU's cuDNN and cuBLAS calls by library.py; this module classifies.
"""

from __future__ import annotations

import dataclasses

from jaxpar import hlo
from jaxpar.predict.kernels import library
from jaxpar.predict.kernels.matrix import KINDS, THIN, Matmul, conv_keys, matmul

__all__ = [
    "CLASS_FALLBACK",
    "FEW_LENGTH",
    "FEW_RESULTS",
    "GENERATES",
    "KINDS",
    "MEMORY_CLASSES",
    "THIN",
    "Matmul",
    "OpClasses",
    "classify",
    "conv_keys",
    "cpu_class",
    "kernel_bytes",
    "largest_reduction",
    "matmuls_of",
    "matrix_classes",
    "memory_class",
    "reduction_class",
]

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
    # read from the program's kernels (memory_class), XLA:CPU's and XLA:GPU's alike; a GPU
    # profile prices each class at its own costs (memory_kernel_costs)
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


# Classes of memory-bound GPU kernels, whose costs differ on the same bytes (read from a GPU's
# kernel traces: benchmarks/gpu_traces.sh and benchmarks/reduce_micro.py, see docs/predict.md,
# which also gives the thresholds' origin): a reduction (BatchNorm's statistics, a bias
# gradient), a reduction into few results (reduce_few: fewer than FEW_RESULTS, each summing at
# least FEW_LENGTH elements, which XLA:GPU spreads over its results alone, so that its rate is
# its results times one lane's: OpClasses.lane_bytes), a transpose (a weight into cuDNN's
# layout), a window (pooling and its gradient: each input read by several outputs), and
# everything else elementwise.
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


def matrix_classes(mm: Matmul | None) -> OpClasses:
    """One matrix kernel as op classes: a Winograd convolution's FLOPs apart (none: nothing)."""
    if mm is None:
        return OpClasses()
    if mm.winograd:
        return OpClasses(conv3x3_flops=mm.flops, matmuls=(mm,))
    return OpClasses(matmul_flops=mm.flops, matmuls=(mm,))


def matmuls_of(ins: hlo.Instruction, program: hlo.Program) -> list[Matmul]:
    """The matrix kernels an instruction runs: a convolution or dot, a cuDNN or cuBLAS call
    (XLA:GPU's form), or those a fusion holds (the one walk over a fusion's kernels)."""
    if ins.opcode in ("convolution", "dot"):
        return [matmul(ins, program.types)]
    if ins.opcode == "custom-call":
        call = library.library_matmul(ins, program.types)
        return [call] if call is not None else []
    if ins.opcode != "fusion":
        return []
    return [m for c in ins.callees for inner in program.body(c) for m in matmuls_of(inner, program)]


def classify(text: str, compiler: str = "cpu") -> OpClasses:
    """Op classes of one compiled program (its `as_text()`), per device per call; `compiler`
    "gpu" for an XLA:GPU program (its memory-bound kernels' classes are the GPU's)."""
    program = hlo.parse(text)
    types = program.types

    def walk(name: str, seen: frozenset = frozenset()) -> OpClasses:
        out = OpClasses()
        for ins in program.body(name):
            op = ins.opcode
            if op in _FREE or op.removesuffix("-start") in hlo.KINDS or op.endswith("-done"):
                continue  # collectives are priced by their bytes and links, not here
            if op in _CONTROL:
                for callee in ins.callees:
                    if callee not in seen:
                        out = out + walk(callee, seen | {name})
                continue
            # a convolution or dot, a cuDNN or cuBLAS call, a fusion holding them
            mm = sum(map(matrix_classes, matmuls_of(ins, program)), OpClasses())
            if mm.flops:
                out = out + mm + OpClasses(kernels=1)
                continue
            kind, results = memory_class(ins, program)
            kind = cpu_class(kind, ins, types) if compiler == "cpu" else kind
            moved = kernel_bytes(ins, types, kind)
            lane = moved / results if kind == "reduce_few" else 0.0
            out = out + OpClasses(
                memory_bytes=moved, kernels=1, lane_bytes=lane, memory_classes=((kind, moved, 1),)
            )
        return out

    return walk("ENTRY")


def kernel_bytes(ins: hlo.Instruction, types: dict[str, str], kind: str) -> float:
    """Bytes a memory-bound kernel moves: its result and its operands, where an elementwise or
    transposing kernel reads at most one element of an operand per element of its result (a
    slice of a concatenation's gradient reads the slice, not the whole operand; XLA computes a
    loop fusion's expression at its result's indices only). Reductions and windows read whole
    operands."""
    out = hlo.shape_bytes(ins.type)
    each = hlo.largest_elements(ins.type)
    total = float(out)
    for a in set(ins.operands):
        if a not in types:
            continue
        size = hlo.shape_bytes(types[a])
        if kind in ("elementwise", "transpose") and size:
            elements = max(hlo.elements(types[a]), 1)
            size = min(size, each * size // elements)
        total += size
    return total


def cpu_class(kind: str, ins: hlo.Instruction, types: dict[str, str]) -> str:
    """A CPU kernel's class: `kind` (memory_class), or generate where an elementwise kernel
    writes GENERATES or more times the bytes it reads (MEMORY_CLASSES)."""
    if kind != "elementwise":
        return kind
    reads = sum(hlo.shape_bytes(types[a]) for a in set(ins.operands) if a in types)
    return "generate" if reads * GENERATES <= hlo.shape_bytes(ins.type) else kind


def memory_class(ins: hlo.Instruction, program: hlo.Program) -> tuple[str, int]:
    """A memory-bound kernel's class (MEMORY_CLASSES) from what its instruction holds, with its
    results where that is reduce_few (else 1): a window (pooling, its gradient, a scatter), a
    transpose (or a reversal), a reduction, or elementwise."""
    ops, todo = set(), [ins]
    while todo:
        i = todo.pop()
        ops.add(i.opcode)
        todo += [inner for c in i.callees for inner in program.body(c)]
    if ops & {"reduce-window", "select-and-scatter", "scatter"}:
        return "window", 1
    if ops & {"transpose", "reverse"}:
        return "transpose", 1
    if "reduce" not in ops:
        return "elementwise", 1
    _, results, length, row = largest_reduction(ins, program)
    if row or results == 1:
        return "reduce", 1
    kind = reduction_class(results, length)
    return kind, results if kind == "reduce_few" else 1


def largest_reduction(ins: hlo.Instruction, program: hlo.Program) -> tuple[int, int, int, bool]:
    """(elements read, results, elements summed into each, row) of the largest reduction in the
    computations an instruction calls, row when it sums along its
    operand's minor dimension (XLA:GPU's row reduction: a warp or a block per result);
    (0, 1, 1, False) if it holds none."""
    best, todo = (0, 1, 1, False), list(ins.callees)
    while todo:
        body = program.body(todo.pop())
        types = {i.name: i.type for i in body}
        for inner in body:
            todo += inner.callees if inner.opcode == "fusion" else []
            args = inner.operands
            if inner.opcode == "reduce" and args and args[0] in types:
                read, results = hlo.elements(types[args[0]]), max(hlo.elements(inner.type), 1)
                minor = hlo.minor_dim(types[args[0]])
                row = minor is not None and int(minor) in inner.ints("dimensions")
                best = max(best, (read, results, read // results, row))
    return best
