"""An optimized HLO program (`compiled.as_text()`, XLA:CPU's or XLA:GPU's) read once into its
computations and their instructions, with the shape arithmetic every reader of a program needs.

A `Program` is `computations`: {name: (Instruction, ...)} in the text's order, the entry named
"ENTRY". An `Instruction` keeps its name, result type, opcode and `rest` (the line after the
opcode's parenthesis: operands, then attributes), and reads from it its `operands` (the names
inside the operand list), `callees` (the computations it calls) and attributes (`attribute`,
`ints`, `window`, `dim_labels`, `replica_groups`, `source_target_pairs`, `backend_config` as
JSON and a field of it, `backend_field`: the one reading of them); `replica_groups` (the
function) reads a collective's groups into devices. Several programs' texts joined into one are
read apart (`modules`) by the functions that take text. Types stay text
("f32[8,3]{1,0}", "(f32[8], u8[16])"); the helpers below read them:

- `arrays(type)`: the array types in it, a tuple's elements in order (token[] and opaque types
  included, as XLA prints them);
- `dims(type)` and `elements(type)`: the FIRST array's dimensions and element count (1 for a
  scalar or a type without an array): a tuple's first element, which is what the readers rely
  on (cuDNN and cuBLAS calls return (result, scratch));
- `largest_elements(type)`: the largest array's elements (a multi-output fusion's widest
  result);
- `shape_bytes(type)`: bytes of EVERY array of a dtype in DTYPE_BYTES (a tuple's elements
  summed; token and opaque types, and 4-bit integers, count 0);
- `minor_dim(type)`: the minor-most dimension of the first array's layout ("{1,0}" -> 1).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections.abc import Iterator

import numpy as np

DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "f8e4m3b11fnuz": 1,
}
_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.+?)\s([a-z][a-z0-9\-]*)\((.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(
    r"\b(?:calls|to_apply|body|condition|branch_computations|true_computation|false_computation)"
    r"=(\{[^}]*\}|%?[\w.\-]+)"
)
_BRANCHES = re.compile(r"(?:true_computation|false_computation)=%?([\w.\-]+)")
_BRANCH_LIST = re.compile(r"branch_computations=\{([^}]*)\}")
_DIMS = re.compile(r"\[([\d,]*)\]")
_ARRAY = re.compile(r"\b[a-z][a-z0-9]*\[[\d,]*\]")
_SHAPE = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([\d,]*)\]")
_LAYOUT = re.compile(r"\{([\d,]+)\}")
_ATTRIBUTE = re.compile(r",\s*([\w.\-]+)=")
# what delimits an attribute's value: a quoted string (whole), a bracket or a comma
_PART = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\](),]')
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_INT = re.compile(r"-?\d+")
_IOTA = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH_AXIS = re.compile(r"'(\w+)'=(\d+)")
_NAME = re.compile(r"'(\w+)'")
_GROUP = re.compile(r"\{([\d,]*)\}")


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One line of a computation: `%name = type opcode(rest`."""

    name: str
    type: str  # result type as printed ("f32[8,3]{1,0}", a tuple "(f32[8], u8[16])")
    opcode: str  # "fusion", "convolution", "custom-call", "all-reduce-start", ...
    rest: str  # the line after "opcode(": operands, ")", then attributes

    @functools.cached_property
    def operands(self) -> list[str]:
        """Operand names, in order (the text up to the operand list's closing parenthesis)."""
        return operands(self.rest)

    @functools.cached_property
    def callees(self) -> list[str]:
        """Computations it calls: a fusion's `calls`, a reduction's `to_apply`, a loop's
        `condition` and `body`, a conditional's branches (`branch_computations`, or a predicated
        one's `true_computation` and `false_computation`)."""
        return callees(self.rest)

    @functools.cached_property
    def branches(self) -> list[str]:
        """A conditional's branch computations, in either form XLA prints; [] otherwise."""
        if self.opcode != "conditional":
            return []
        found = _BRANCHES.findall(self.rest)
        listed = _BRANCH_LIST.search(self.rest)
        if listed:
            found += [b.strip().lstrip("%") for b in listed.group(1).split(",")]
        return found

    @functools.cached_property
    def attributes(self) -> dict[str, str]:
        """Its attributes (each `name=value` after the operand list) by name, in the text's
        order: a value as printed, one in braces, brackets or parentheses whole with them
        (`window={size=3x3 pad=1_1x1_1}` -> "{size=3x3 pad=1_1x1_1}"), a quoted one without
        its quotes (`custom_call_target="__cudnn$convForward"` -> "__cudnn$convForward")."""
        found, at = {}, _operands_end(self.rest) + 1
        while name := _ATTRIBUTE.match(self.rest, at):
            depth, at = 0, len(self.rest)
            for part in _PART.finditer(self.rest, name.end()):
                p = part.group()
                depth += (p in "{[(") - (p in "}])")
                if p == "," and depth == 0:
                    at = part.start()
                    break
            value = self.rest[name.end() : at].strip()
            found[name.group(1)] = value[1:-1] if _QUOTED.fullmatch(value) else value
        return found

    def attribute(self, name: str) -> str | None:
        """The value of attribute `name` (`attributes`); None where it has none."""
        return self.attributes.get(name)

    def ints(self, name: str) -> tuple[int, ...]:
        """The integers of a list attribute (`dimensions={0,2}` -> (0, 2)); () without it."""
        return tuple(int(n) for n in _INT.findall(self.attribute(name) or ""))

    def window(self) -> dict[str, tuple[int, ...]]:
        """A convolution's or window reduction's window, each field's numbers in order
        (`window={size=3x3 stride=2x2 pad=0_1x0_1}` -> {"size": (3, 3), "stride": (2, 2),
        "pad": (0, 1, 0, 1)}: a pad's low and high per dimension); {} without one. A field XLA
        leaves out has its default (stride and dilation 1, pad 0)."""
        fields = (f.split("=", 1) for f in (self.attribute("window") or "").strip("{}").split())
        return {k: tuple(int(n) for n in _INT.findall(v)) for k, v in fields}

    def replica_groups(self) -> str:
        """A collective's replica groups as printed (`{{0,1},{2,3}}`, iota `[2,4]<=[8]`, or
        `mesh['x'=2,'y'=4] {'y'}`), a permute's source-target pairs (`{{0,1},{1,0}}`); "" for
        neither. `replica_groups` (the function) reads them into devices."""
        return self.attribute("replica_groups") or self.attribute("source_target_pairs") or ""

    def source_target_pairs(self) -> tuple[tuple[int, int], ...]:
        """A collective-permute's (source, target) devices, in order; () without them."""
        numbers = self.ints("source_target_pairs")
        return tuple(zip(numbers[::2], numbers[1::2], strict=True))

    def backend_config(self) -> dict:
        """Its backend_config parsed as JSON (XLA:GPU's: a cuBLAS call's `gemm_backend_config`,
        ...), printed bare or as an escaped string; {} without one."""
        text = self.attribute("backend_config")
        if not text:
            return {}
        try:
            found = json.loads(text)
        except ValueError:
            found = json.loads(json.loads(f'"{text}"'))  # printed quoted: its quotes escaped
        return found if isinstance(found, dict) else {}

    def backend_field(self, name: str):
        """The field `name` of its backend_config's JSON wherever it sits (the first found,
        depth first), None without it."""
        todo = [self.backend_config()]
        while todo:
            value = todo.pop(0)
            if isinstance(value, dict):
                if name in value:
                    return value[name]
                todo[:0] = list(value.values())
            elif isinstance(value, list):
                todo[:0] = value
        return None

    def dim_labels(self) -> tuple[str, str, str] | None:
        """A convolution's dimension labels, (input, kernel, output): `dim_labels=b01f_01io->b01f`
        -> ("b01f", "01io", "b01f"); None without them."""
        labels = (self.attribute("dim_labels") or "").replace("->", "_").split("_")
        return (labels[0], labels[1], labels[2]) if len(labels) == 3 else None


@dataclasses.dataclass(frozen=True)
class Program:
    """A program's computations in the text's order, the entry as "ENTRY"."""

    computations: dict[str, tuple[Instruction, ...]]

    @property
    def entry(self) -> tuple[Instruction, ...]:
        return self.computations.get("ENTRY", ())

    @functools.cached_property
    def by_name(self) -> dict[str, Instruction]:
        """Every instruction by name (a name printed twice: the later one)."""
        return {i.name: i for body in self.computations.values() for i in body}

    @functools.cached_property
    def types(self) -> dict[str, str]:
        """Every instruction's result type by name."""
        return {name: i.type for name, i in self.by_name.items()}

    def instructions(self) -> Iterator[tuple[str, Instruction]]:
        """(computation, instruction) of every instruction, in the text's order."""
        for comp, body in self.computations.items():
            for ins in body:
                yield comp, ins

    def body(self, name: str) -> tuple[Instruction, ...]:
        """A computation's instructions; () for a name the program lacks."""
        return self.computations.get(name, ())

    @functools.cached_property
    def branch_computations(self) -> frozenset[str]:
        """Computations that are a conditional's branches (run only when taken)."""
        return frozenset(b for _, i in self.instructions() for b in i.branches)


@functools.lru_cache(maxsize=8)
def parse(text: str) -> Program:
    """A program's text read into its computations (cached: readers of the same program share
    one reading)."""
    comps: dict[str, list[Instruction]] = {}
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
                comps[current].append(Instruction(*m.groups()))
    return Program({name: tuple(body) for name, body in comps.items()})


def operands(rest: str) -> list[str]:
    """The operand names in an instruction's text after its opcode's parenthesis."""
    return _OPERAND.findall(rest[: _operands_end(rest)])


def _operands_end(rest: str) -> int:
    """Where the operand list's closing parenthesis is in `rest` (its length if none)."""
    depth = 1
    for i, ch in enumerate(rest):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return i
    return len(rest)


def modules(text: str) -> list[str]:
    """Texts of several programs joined into one (each from its "HloModule" line) apart."""
    starts = [m.start() for m in re.finditer(r"^HloModule", text, re.MULTILINE)]
    if len(starts) < 2:
        return [text]
    return [text[a:b] for a, b in zip([0, *starts[1:]], [*starts[1:], len(text)])]


def callees(rest: str) -> list[str]:
    """The computations an instruction's text (after its opcode) names as called."""
    out = []
    for group in _CALLS.findall(rest):
        out += [name.strip(" {}%") for name in group.split(",") if name.strip(" {}")]
    return out


def arrays(type_text: str) -> list[str]:
    """The array types in an HLO type (one, or a tuple's elements)."""
    return _ARRAY.findall(type_text)


def dims(type_text: str) -> list[int]:
    """The first array's dimensions ([] for a scalar or no array)."""
    found = _DIMS.search(type_text)
    return [int(d) for d in found.group(1).split(",") if d] if found else []


def elements(type_text: str) -> int:
    """The first array's element count (1 for a scalar or no array)."""
    return math.prod(dims(type_text))


def largest_elements(type_text: str) -> int:
    """The largest array's element count in a type (1 without any array)."""
    return max((math.prod(d) if (d := dims(t)) else 1 for t in arrays(type_text)), default=1)


def shape_bytes(type_text: str) -> int:
    """Total bytes of every array shape in an HLO type such as "(f32[8], f32[3,3])"."""
    total = 0
    for dtype, sizes in _SHAPE.findall(type_text):
        size = math.prod(int(d) for d in sizes.split(",") if d) if sizes else 1
        total += size * DTYPE_BYTES[dtype]
    return total


def minor_dim(type_text: str) -> str | None:
    """The first array's minor-most dimension from its layout ("f32[4,8]{1,0}" -> "1"), None
    without a layout."""
    layout = _LAYOUT.search(type_text.split("]", 1)[-1])
    return layout.group(1).split(",")[0] if layout else None


def replica_groups(text: str) -> list[list[int]]:
    """Replica groups (`Instruction.replica_groups`) as lists of device indices, from each form
    XLA prints: explicit `{{0,4},{1,5}}`, iota `[2,4]<=[8]` / `[4,2]<=[2,4]T(1,0)`, or a mesh's
    `mesh['axis_0'=2,'axis_1'=4] {'axis_1'}` (groups vary along the named axes)."""
    if text.startswith("mesh["):
        sizes = [(n, int(v)) for n, v in _MESH_AXIS.findall(text.split("]")[0])]
        chosen = _NAME.findall(text.split("]", 1)[1])
        ids = np.arange(int(np.prod([v for _, v in sizes]))).reshape([v for _, v in sizes])
        order = [i for i, (n, _) in enumerate(sizes) if n not in chosen] + [
            i for i, (n, _) in enumerate(sizes) if n in chosen
        ]
        size = int(np.prod([v for n, v in sizes if n in chosen]))
        return ids.transpose(order).reshape(-1, size).tolist()
    match = _IOTA.fullmatch(text.strip())
    if match:
        shape = [int(x) for x in match.group(1).split(",")]
        dims = [int(x) for x in match.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if match.group(3):
            ids = ids.transpose([int(x) for x in match.group(3).split(",")])
        return ids.reshape(shape[0], -1).tolist()
    return [[int(x) for x in g.split(",") if x] for g in _GROUP.findall(text)]
