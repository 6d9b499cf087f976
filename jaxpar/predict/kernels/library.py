"""XLA:GPU's library calls: a cuDNN convolution or a cuBLAS matrix product (a custom call) read
as one matrix kernel (matrix.Matmul), as opclass.classify counts it in a GPU's program."""

from __future__ import annotations

import math

from jaxpar import hlo
from jaxpar.predict.kernels.matrix import THIN, WINOGRAD, Matmul

# The custom_call_target prefixes of a cuDNN convolution and a cuBLAS matrix product in an
# XLA:GPU program ("__cudnn$convForward", "__cublas$gemm", "__cublas$lt$matmul", ...)
_LIBRARY = ("__cudnn$conv", "__cublas$")


def library_target(ins: hlo.Instruction) -> str | None:
    """The library routine a custom call runs ("cudnn$convForward", "cublas$gemm"), None for
    another custom call."""
    target = ins.attribute("custom_call_target") or ""
    if not target.startswith(_LIBRARY) or not target[2:].replace("$", "_").isidentifier():
        return None
    return target[2:]


def contracting_dims(ins: hlo.Instruction) -> list[int]:
    """A cuBLAS call's contracting dimensions of its first operand: a field of its
    backend_config's JSON (gemm_backend_config's dot_dimension_numbers), which has no attribute
    of its own (a dot's lhs_contracting_dims); [] without it."""
    return [int(d) for d in ins.backend_field("lhs_contracting_dimensions") or ()]


def library_matmul(ins: hlo.Instruction, types: dict[str, str]) -> Matmul | None:
    """A cuDNN convolution or cuBLAS product of an XLA:GPU program, as one matrix kernel (None
    for another custom call, or where its shapes are not those of a 2-D convolution).

    XLA:GPU writes each of a convolution's three kernels with the forward convolution's window
    and dimension labels: the forward reads (x, w) and writes y, the input gradient reads (dy,
    w) and writes dx, the weight gradient reads (x, dy) and writes dw. So x, w and y are found
    by the kernel's kind, and each kernel does the forward's multiply-adds."""
    target = library_target(ins)
    if target is None:  # another custom call
        return None
    result = ins.type
    args = [a for a in ins.operands if a in types]
    arrays = [types[a] for a in args]
    out = hlo.arrays(result)[0]  # cuDNN and cuBLAS return (result, scratch)
    moved = float(hlo.shape_bytes(out) + sum(hlo.shape_bytes(t) for t in arrays))
    if target.startswith("cublas"):
        lhs = hlo.dims(arrays[0]) if arrays else []
        k = math.prod(lhs[i] for i in contracting_dims(ins))
        n, flops = (hlo.dims(out) or [1])[-1], 2.0 * hlo.elements(out) * k
        narrow = max(1, min(hlo.elements(out) // max(n, 1), n, k))
        return Matmul(flops, moved, False, narrow, tile=narrow)
    if len(arrays) < 2:
        return None
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
    labels, window = ins.dim_labels(), ins.window()
    xd, wd, yd = hlo.dims(x), hlo.dims(w), hlo.dims(y)
    if not labels or not window or len(xd) != 4 or len(wd) != 4 or len(yd) != 4:
        return None
    xl, wl, yl = labels
    n, c, k = xd[xl.index("b")], xd[xl.index("f")], yd[yl.index("f")]
    h, wide, p, q = xd[xl.index("0")], xd[xl.index("1")], yd[yl.index("0")], yd[yl.index("1")]
    (r, s), stride = window.get("size", (1, 1)), window.get("stride", (1, 1))
    per_output = math.prod(wd) // max(wd[wl.index("o")], 1)  # r x s x c / groups
    flops = 2.0 * math.prod(yd) * per_output
    grouped = per_output != r * s * c
    winograd = (
        r == s
        and str(r) in WINOGRAD
        and stride == (1, 1)
        and not grouped
        and not {"lhs_dilate", "rhs_dilate"} & window.keys()
    )
    rows = n * h * wide if kind == "input gradient" else n * p * q
    gemm = {
        "forward": (rows, k, per_output),
        "input gradient": (rows, c, k * r * s),
        "filter gradient": (per_output, k, rows),
    }[kind]
    thin = c < THIN and kind != "input gradient"
    key = (n, h, wide, c, k, r, s, *stride, p, q, kind)
    return Matmul(flops, moved, winograd, max(1, min(gemm)), thin, max(1, min(rows, c, k)), (key,))
