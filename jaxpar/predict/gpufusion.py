"""A GPU's program, modelled from the CPU-compiled one: kernels, bytes and memory as XLA:GPU
would make them.

The predictor compiles every program on simulated CPU devices, so it can run anywhere. Compiling
the step for a GPU target ahead of time on a machine without one is not possible with the
pinned JAX (0.10.2): the CUDA compiler lives in the jax-cuda plugin, which needs a GPU and its
driver to create a client, and JAX exposes no deviceless GPU target. XLA:CPU and XLA:GPU start
from the same optimised HLO but lower it differently, and the difference is large on the
figures a GPU's time depends on: ResNet-50 at 224x224 in bfloat16, batch 256, is 1,822 kernels
and 313 GB of memory-bound traffic in the CPU program, where the H200 ran it as 1,327 kernels
(measured: benchmarks/single_device.py) and the CPU program asks for 39.1 GB of memory where
the GPU program needs 10.65 GB (10.81 GB peak in use). So the CPU program is re-fused here as
XLA:GPU would fuse it, by rules that each name what the GPU compiler does (applied in the
order 1, 6, 2, then 3-5 and 7-9 as each kernel is priced):

1. A convolution or dot (alone or in a fusion) is one kernel (cuDNN or cuBLAS) and reads its
   operands in the program's compute dtype. XLA:CPU runs bfloat16 convolutions in float32
   (YNNPACK): it converts each activation to float32, transposes the weight gradient's
   operands and writes float32 results. A kernel that only moves or converts data (convert,
   copy, transpose, broadcast, reshape, slice) and feeds only matrix kernels is absorbed into
   them: cuDNN reads the source's layout and dtype directly. A conversion that narrows (float32
   weights to bfloat16) stays a kernel, as it does on the GPU.
2. An elementwise or reduction kernel whose result is used by exactly one other such kernel
   is fused into it (XLA:GPU's producer-consumer fusion; its result never reaches memory).
   An elementwise kernel whose several users are all such kernels is computed inside each
   where that moves no more bytes than storing it: users x its activation-sized reads <=
   those reads + its write + users x its write (XLA:GPU's priority fusion fuses a producer
   into all its users when its cost model finds that faster). A ReLU's input (a BatchNorm's
   output, or at a residual block's end that plus the shortcut: two activations read), read
   by the ReLU and by its backward, is one: XLA:CPU stores it in a bfloat16 step, and
   modelled stored, ResNet-50 at 224 in bfloat16 needed 7.70 GB where
   the H100's program needs 5.43 GB and moved 41.8 GB where it moves 38.2; computed inside
   its users, 5.68 GB and 38.5 GB.
3. A kernel with no operands (an iota) is generated inside its consumers, and an integer
   tensor of an activation's size (the window indices XLA:CPU materialises for a max-pool's
   gradient) costs nothing: the GPU's select-and-scatter recomputes it from the input.
4. In a bfloat16 (float16) program a float32 tensor that is not shaped like a parameter
   crosses memory in the compute dtype: the CPU's float32 activations are the GPU's bfloat16.
5. A memory-bound kernel reads at most three activation-sized tensors (a BatchNorm or residual
   backward: the output gradient, the residual's and the input): XLA:CPU fuses the whole
   residual stream of a stage into one kernel that recomputes it from every convolution's
   output (ResNet-152's 14x14 stage: kernels with up to 39 such inputs), where XLA:GPU's cost
   model stores the stream and reads it once; the most recently computed three are kept.
6. A memory-bound kernel that computes what another computes from the same inputs, only
   transposed, for matrix kernels alone, is not made: XLA:CPU's float32 weight gradients read
   their operands transposed, while cuDNN reads the other's result as it is. On ResNet-50 at
   224 in float32 this is a third of the modelled traffic (117 against the H100 program's 73 GB
   before; 77 after).
7. A long reduction (one that sums more than 4,096 elements into each result: a BatchNorm
   statistic or a bias gradient over a batch of large maps) is two kernels: XLA:GPU splits it
   into partial sums and a small final one that sums about sqrt(length) of them into each
   result (its ResNet-50 program: 161 of 262 such reductions, and 165 final kernels;
   Inception-v3's 64 x 147 x 147 = 1,382,976 elements per result: 1,176 partials). Counted by the reduction's length, not its size: in
   the GPU's own programs of eight models, reductions of up to 4,096 elements per result run
   whole (VGG19's 4x4 maps over a batch of 128: 2,048; DenseNet's and Inception's 8x8 maps
   over 64: 4,096) and every one of 6,272 (ResNet-50's 7x7 maps over 128) or more is split.
8. Each memory-bound kernel has a class, as the GPU's program names it (opclass.MEMORY_CLASSES):
   a window (pooling, its gradient, a scatter), a transpose (one that transposes or reverses,
   or a weight's conversion that only matrix kernels read: XLA:GPU lays each filter out for
   cuDNN in a transposing kernel of its own), a reduction, else elementwise. A profile may
   price each class at its own costs (memory_kernel_costs): on an H100 a transpose or a window
   moves its bytes at about half an elementwise kernel's rate.
9. A reduction kernel into fewer than 1,024 results, each summing 256 or more elements (a
   BatchNorm statistic over 4x4 or 8x8 maps, a split reduction's final kernel), is its own
   class, reduce_few: XLA:GPU spreads a reduction over its results alone, so such a kernel
   runs on a few of the GPU's cores and takes a time set by the bytes each result's lane
   moves (OpClasses.lane_bytes). In an H100's programs, DenseNet-40's 4,096 float32 rows
   into 304-448 results all took about 7 us whatever the number of results (0.7-1.1 TB/s),
   where ResNet-50's reductions into many results ran at 2.3-2.5 TB/s; a profile prices the
   class by one lane's rate (memory_kernel_costs["reduce_few"]: about 1.1 GB/s per result).
   A row reduction (along the minor dimension: a loss over classes, a norm of a whole weight
   as LARS takes it, anything into one result) is not: XLA:GPU gives each result a warp or a
   block.

What a kernel moves is the bytes of its distinct inputs plus its outputs that anything outside
it uses. Memory is the state the program is given plus the peak of its live intermediate
results, each alive from the kernel that writes it to the last kernel that reads it, in the
CPU program's order (XLA schedules both for memory the same way); XLA:GPU's buffer reuse and
cuDNN's workspaces are not modelled. tests/test_gpufusion.py pins the rules on small programs;
docs/predict.md ("Pricing the GPU's program") gives its errors against GPU programs measured.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

from jaxpar import hlo
from jaxpar.predict import opclass

_MOVE = {"parameter", "convert", "copy", "transpose", "bitcast", "reshape", "broadcast",
         "constant", "tuple", "get-tuple-element", "slice"}  # fmt: skip
_REDUCING = {"reduce", "reduce-window", "scatter", "select-and-scatter", "sort", "concatenate",
             "pad", "gather", "dynamic-slice", "dynamic-update-slice"}  # fmt: skip
_NONE = {"parameter", "constant", "tuple", "after-all", "partition-id", "replica-id"}
_INT = re.compile(r"^\(?\s*(?:[su](?:8|16|32|64)|pred)\[")
_BIG = 1 << 20  # bytes: below this a tensor is a parameter's, a statistic's or a scalar's
_MAX_BIG_INPUTS = 3  # activation-sized inputs of one memory-bound GPU kernel (rule 5)
_SPLIT = 4096  # a reduction summing more elements into each result is split (rule 7)


@dataclasses.dataclass
class _Node:
    kind: str  # "matmul", "memory", "move", "iota", "absorbed", "inlined"
    result: str
    args: list[str]
    ops: opclass.OpClasses  # the CPU's reading: FLOPs of a matrix kernel
    reduces: bool = False  # holds a reduction, a window, a scatter: not duplicated
    transposes: bool = False  # holds a transpose
    computes: frozenset = frozenset()  # the operations it holds besides moving data


@dataclasses.dataclass(frozen=True)
class GpuProgram:
    """One program as XLA:GPU would run it, per device per call."""

    ops: opclass.OpClasses  # FLOPs, memory-bound bytes, kernels, each matrix kernel's bytes
    temp_bytes: int  # peak of live intermediate results
    state_bytes: int  # the program's parameters (arguments)
    # each kernel: (its CPU instructions, "matmul" or its memory class (rule 8), bytes)
    kernels: tuple[tuple[str, str, int], ...] = ()


def _body_ops(rest: str, comps: dict) -> set[str]:
    out: set[str] = set()
    for callee in opclass._called(rest):
        for _, _, op, inner in comps.get(callee, ()):
            out.add(op)
            if op == "fusion":
                out |= _body_ops(inner, comps)
    return out


def analyse(text: str, compute_dtype: str = "float32") -> GpuProgram:
    """The program `text` (a CPU-compiled module's as_text()) as XLA:GPU would fuse it."""
    g = _Graph(text, compute_dtype)
    g.absorb()  # rule 1
    g.twins()  # rule 6
    g.inline()  # rule 2, duplicated producers
    g.fuse()  # rule 2, producer-consumer
    return g.price()  # rules 3-5 and the memory


class _Graph:
    """The entry computation's kernels, their operands and users, and what each rule did."""

    def __init__(self, text: str, compute_dtype: str):
        self.comps = opclass._computations(text)
        self.types = {n: r for body in self.comps.values() for n, r, _, _ in body}
        self.lowp = compute_dtype in ("bfloat16", "float16")
        entry = self.comps["ENTRY"]
        self.param_shapes = {_shape(r) for _, r, op, _ in entry  # float32 state
                             if op == "parameter" and r.lstrip("(").startswith("f32[")}  # fmt: skip
        self.nodes: dict[str, _Node] = {}
        self.order: list[str] = []
        self.rest = {name: rest for name, _, _, rest in entry}  # each instruction's text
        self.view: dict[str, str] = {}  # a tuple's element (get-tuple-element): whose, own size
        self.root: set[str] = set()
        self.state = 0
        alias: dict[str, str] = {}  # a bitcast: the same buffer
        for name, result, op, rest in entry:
            args = [alias.get(a, a) for a in opclass._operands(rest)]
            if op == "bitcast":
                alias[name] = args[0] if args else name
            elif op == "get-tuple-element":
                self.view[name] = self.view.get(args[0], args[0]) if args else name
            elif op == "parameter":
                self.state += hlo.shape_bytes(result)
            elif op == "tuple":  # the entry's result
                self.root |= {self.base(a) for a in args}
            elif op not in _NONE and (node := self._node(op, result, rest, args)):
                self.nodes[name] = node
                self.order.append(name)
        self.users: dict[str, set[str]] = collections.defaultdict(set)
        for n in self.order:
            for a in self.nodes[n].args:
                self.users[self.base(a)].add(n)
        self.group = {n: n for n in self.order}
        self.position = {n: i for i, n in enumerate(self.order)}

    def _node(self, op: str, result: str, rest: str, args: list[str]) -> _Node | None:
        """One top-level instruction as a kernel; None for a collective (priced by its bytes
        and links, not here)."""
        body = _body_ops(rest, self.comps) if op == "fusion" else {op}
        if body & {"convolution", "dot"}:
            mm = opclass.OpClasses()
            if op in ("convolution", "dot"):
                mm = opclass._matmul(op, result, rest, self.types)
            for callee in opclass._called(rest) if op == "fusion" else ():
                for _, r2, op2, rest2 in self.comps.get(callee, ()):
                    if op2 in ("convolution", "dot"):
                        mm = mm + opclass._matmul(op2, r2, rest2, self.types)
            return _Node("matmul", result, args, mm)
        if op.removesuffix("-start") in hlo.KINDS or op.endswith("-done"):
            return None
        if op in opclass._CONTROL:
            kind = "memory"  # a loop's body is not re-fused: priced as one kernel's traffic
        elif op == "fusion" and not args:
            kind = "iota"
        else:
            kind = "move" if body <= _MOVE else "memory"
        return _Node(kind, result, args, opclass.OpClasses(), bool(body & _REDUCING),
                     "transpose" in body, frozenset(body - _MOVE))  # fmt: skip

    def base(self, a: str) -> str:
        """The kernel whose result `a` reads."""
        return self.view.get(a, a)

    def kind(self, a: str) -> str | None:
        return self.nodes[self.base(a)].kind if self.base(a) in self.nodes else None

    def absorb(self) -> None:
        """Rule 1: data movement that feeds only matrix kernels is absorbed, unless it narrows."""
        for n in self.order:
            node = self.nodes[n]
            narrows = hlo.shape_bytes(node.result) < sum(hlo.shape_bytes(self.types.get(a, ""))
                                                         for a in node.args)  # fmt: skip
            if (node.kind == "move" and n not in self.root and self.users[n] and not narrows
                    and all(self.nodes[u].kind == "matmul" for u in self.users[n])):  # fmt: skip
                node.kind = "absorbed"

    def twins(self) -> None:
        """Rule 6: a memory-bound kernel that transposes what another computes from the same
        inputs, for matrix kernels alone (XLA:CPU's float32 weight gradients read their
        operands transposed), is not made: the GPU's convolutions read the other's result."""
        made: dict[tuple, str] = {}
        for n in self.order:
            node = self.nodes[n]
            if node.kind == "memory" and not node.transposes:
                key = (frozenset(map(self.base, node.args)), _elements(node.result), node.computes)
                made.setdefault(key, n)
        for n in self.order:
            node = self.nodes[n]
            twin = made.get((frozenset(map(self.base, node.args)), _elements(node.result),
                             node.computes))  # fmt: skip
            if (node.kind == "memory" and node.transposes and twin and n not in self.root
                    and self.users[n] and all(self.nodes[u].kind == "matmul" for u in self.users[n])):  # fmt: skip
                node.kind, node.args = "inlined", [twin]

    def inline(self) -> None:
        """Rule 2: an elementwise kernel whose users are all elementwise or reduction kernels
        is computed inside each of them where that moves no more bytes (XLA:GPU's priority
        fusion duplicates a producer into all its consumers when that is faster): users x its
        activation-sized reads <= those reads + its write + users x its write. Not on top of
        an activation-sized producer computed inside it already, nor a small one (a
        statistic's) on top of another small one."""
        for n in self.order:
            node = self.nodes[n]
            users = len(self.users[n])
            reads = sum(self.size(a) for a in set(node.args) if self.size(a) >= _BIG)
            if (node.kind == "memory" and n not in self.root and users > 1
                    and not node.reduces and (users - 1) * reads <= (users + 1) * self.size(n)
                    and all(self.nodes[u].kind in ("memory", "move") for u in self.users[n])
                    and not any(self.kind(a) == "inlined" and (self.size(a) >= _BIG
                                                                 or self.size(n) < _BIG)
                                for a in node.args)):  # fmt: skip
                node.kind = "inlined"

    def find(self, n: str) -> str:
        while self.group[n] != n:
            self.group[n] = self.group[self.group[n]]
            n = self.group[n]
        return n

    def fuse(self) -> None:
        """Rule 2: a memory-bound kernel whose result one other such kernel reads is fused
        into it (its result never reaches memory)."""
        fusible = ("memory", "move")
        changed = True
        while changed:
            changed = False
            for n in reversed(self.order):
                if self.nodes[n].kind not in fusible or n in self.root or self.find(n) != n:
                    continue
                targets = {self.find(u) for u in self.users[n]
                           if self.nodes[u].kind not in ("absorbed", "inlined")}  # fmt: skip
                if len(targets) == 1:
                    (g,) = targets
                    if g != n and self.nodes[g].kind in fusible:
                        self.group[n] = g
                        changed = True

    def reduction(self, n: str) -> tuple[int, int] | None:
        """(results, elements summed into each) of the reduction `n` holds; None if none. The
        results are its smallest output (a fusion may also write activation-sized ones)."""
        if "reduce" not in self.nodes[n].computes:
            return None
        read = max((_elements(self.types.get(a, "")) for a in self.nodes[n].args), default=0)
        results = max(min(_all_elements(self.nodes[n].result), default=1), 1)
        return results, read // results

    def row_reduction(self, n: str) -> bool:
        """Whether a reduction `n` holds sums along its operand's last (minor) dimension: a row
        reduction, which XLA:GPU gives a warp or a block per result, not one lane (a loss over
        classes, a norm of a whole tensor)."""
        todo, seen = [self.rest.get(n, "")], set()
        while todo:
            for callee in opclass._called(todo.pop()):
                if callee in seen:
                    continue
                seen.add(callee)
                for _, _, op, rest in self.comps.get(callee, ()):
                    if op == "fusion":
                        todo.append(rest)
                    elif op == "reduce" and _reduces_minor(rest, self.types):
                        return True
        return _reduces_minor(self.rest.get(n, ""), self.types) if self.rest.get(n) else False

    def long_reduction(self, n: str) -> bool:
        """Whether `n` sums more than _SPLIT elements into each of its results (rule 7)."""
        r = self.reduction(n)
        return r is not None and r[1] > _SPLIT

    def reduce_kernels(self, group_nodes: list[str], moved: int) -> opclass.OpClasses:
        """A reduction's kernels (rules 7 and 9). Split (rule 7): the partial sums, then a
        final kernel that sums about sqrt(length) partials (float32) into each result. A kernel
        into fewer than opclass.FEW_RESULTS results, each summing at least opclass.FEW_LENGTH
        elements, is reduce_few (rule 9), with its bytes per result as lane_bytes; unless it
        is a row reduction (along the minor dimension, or into one result), which XLA:GPU
        gives a warp or a block per result."""
        found = [(r, m) for m in group_nodes if (r := self.reduction(m))]
        (results, length), main = (
            max(found, key=lambda f: f[0][0] * f[0][1]) if found else ((1, 0), "")
        )
        row = results == 1 or (bool(main) and self.row_reduction(main))
        kernels = [(float(moved), 0 if row else length)]
        if length > _SPLIT:
            partials = math.isqrt(length - 1) + 1
            final = 0 if row else partials
            kernels = [(float(moved), 0), (4.0 * results * (partials + 1), final)]
        total = opclass.OpClasses()
        for nbytes, summed in kernels:
            name = opclass.reduction_class(results, summed)
            total += opclass.OpClasses(memory_bytes=nbytes, kernels=1,
                                       memory_classes=((name, nbytes, 1),),
                                       lane_bytes=nbytes / results if name == "reduce_few" else 0)  # fmt: skip
        return total

    def sources(self, a: str) -> set[str]:
        """What reading `a` reads from memory: through absorbed and inlined kernels."""
        b = self.base(a)
        if self.kind(a) in ("absorbed", "inlined"):
            return set().union(*(self.sources(c) for c in self.nodes[b].args))
        return {a}

    def size(self, a: str) -> int:
        """Bytes of `a` as it crosses the GPU's memory (rules 3 and 4)."""
        t = self.types.get(a, "")
        b = hlo.shape_bytes(t)
        if b >= _BIG and _INT.match(t.strip()):
            return 0  # rule 3: window indices
        if (self.lowp and b >= _BIG and t.lstrip("(").startswith("f32[")
                and _shape(t) not in self.param_shapes):  # fmt: skip
            return b // 2  # rule 4
        return b

    def inputs(self, group_nodes: list[str], kind: str) -> set[str]:
        """What a kernel reads from memory (rule 5: at most three activation-sized tensors for
        a memory-bound one, the most recently computed)."""
        inside = set(group_nodes)
        ins = set().union(*(self.sources(a) for m in group_nodes for a in self.nodes[m].args
                            if self.base(a) not in inside))  # fmt: skip
        ins = {a for a in ins if self.kind(a) != "iota"}
        if kind != "matmul":
            big = sorted((a for a in ins if self.size(a) >= _BIG),
                         key=lambda a: self.position.get(self.base(a), -1), reverse=True)  # fmt: skip
            ins -= set(big[_MAX_BIG_INPUTS:])
        return ins

    def memory_class(self, group_nodes: list[str], outs: list[str]) -> str:
        """Rule 8: a memory-bound kernel's class (opclass.MEMORY_CLASSES), as the GPU's
        program names its kernel: a window (pooling, its gradient, a scatter), a transpose (one
        that transposes or reverses, or that makes a weight for matrix kernels alone: XLA:GPU
        lays each convolution's filter out for cuDNN in a transposing kernel of its own), a
        reduction, or elementwise."""
        computes = frozenset().union(*(self.nodes[m].computes for m in group_nodes))
        if computes & {"reduce-window", "select-and-scatter", "scatter"}:
            return "window"
        weight = outs and all(_shape(self.nodes[m].result) in self.param_shapes
                              and m not in self.root and self.for_matmuls(m) for m in outs)  # fmt: skip
        if weight or "reverse" in computes or any(self.nodes[m].transposes for m in group_nodes):
            return "transpose"
        return "reduce" if "reduce" in computes else "elementwise"

    def for_matmuls(self, n: str) -> bool:
        """Whether matrix kernels alone read `n` (directly or through absorbed kernels)."""
        return bool(self.users[n]) and all(
            self.kind(u) == "matmul" or (self.kind(u) == "absorbed" and self.for_matmuls(u))
            for u in self.users[n]
        )

    def price(self) -> GpuProgram:
        """Each kernel's bytes (its inputs plus the outputs used outside it), and the peak of
        live results, each from the kernel writing it to the last kernel reading it."""
        members: dict[str, list[str]] = collections.defaultdict(list)
        for n in self.order:
            members[self.find(n)].append(n)
        total, listed = opclass.OpClasses(), []
        written: dict[str, int] = {}
        last_read: dict[str, int] = {}
        for g, group_nodes in members.items():
            kind = self.nodes[g].kind
            if kind in ("iota", "absorbed", "inlined"):
                continue
            ins = self.inputs(group_nodes, kind)
            outs = [m for m in group_nodes
                    if m in self.root or any(self.find(u) != g for u in self.users[m])]  # fmt: skip
            moved = sum(self.size(a) for a in ins) + sum(self.size(m) for m in outs)
            if kind == "matmul":
                mm = self.nodes[g].ops
                total += dataclasses.replace(mm, matmuls=_split(mm.matmuls, moved), kernels=1)
            else:
                kind = self.memory_class(group_nodes, outs)
                made = (self.reduce_kernels(group_nodes, moved) if kind == "reduce" else
                        opclass.OpClasses(memory_bytes=float(moved), kernels=1,
                                          memory_classes=((kind, float(moved), 1),)))  # fmt: skip
                total += made
                kind = "+".join(c[0] for c in made.memory_classes)
            listed.append(("+".join(group_nodes), kind, moved))
            at = max(self.position[m] for m in group_nodes)  # where its last member ran
            for m in outs:
                written[m] = at
                if m in self.root:
                    last_read[m] = len(self.order)
            for a in ins:
                last_read[self.base(a)] = max(last_read.get(self.base(a), 0), at)
        buffers = [(at, last_read.get(m, at), self.size(m)) for m, at in written.items()]
        return GpuProgram(total, _peak(buffers, len(self.order)), self.state, tuple(listed))


def _split(per: tuple, moved: float) -> tuple:
    """One kernel's matrix operations with its bytes, shared in proportion to their FLOPs."""
    flops = sum(m.flops for m in per) or 1.0
    return tuple(m._replace(moved=moved * m.flops / flops) for m in per)


def _peak(buffers: list[tuple[int, int, int]], length: int) -> int:
    """Largest sum of live buffers at any kernel (each live from its write to its last read)."""
    delta = [0] * (length + 2)
    for start, end, nbytes in buffers:
        delta[start] += nbytes
        delta[min(end, length) + 1] -= nbytes
    peak = live = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak


def _reduces_minor(rest: str, types: dict) -> bool:
    """Whether the reduce instruction `rest` sums along its first operand's last dimension."""
    dims = re.search(r"dimensions=\{([\d,]*)\}", rest)
    args = opclass._operands(rest)
    if not dims or not args or args[0] not in types:
        return False
    rank = len(re.findall(r"\d+", _shape(types[args[0]])))
    return str(rank - 1) in dims.group(1).split(",")


def _all_elements(type_text: str) -> list[int]:
    """Elements of each array in a type (a tuple's elements in turn)."""
    return [
        math.prod(int(d) for d in m.split(",") if d) for m in re.findall(r"\[([\d,]*)\]", type_text)
    ]


def _elements(type_text: str) -> int:
    m = re.search(r"\[([\d,]*)\]", type_text)
    return 0 if not m else math.prod(int(d) for d in m.group(1).split(",") if d)


def _shape(type_text: str) -> str:
    m = re.search(r"\[[\d,]*\]", type_text)
    return m.group(0) if m else ""
