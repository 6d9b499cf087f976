"""The core never names a mesh axis: jaxpar/ outside jaxpar/axes/ asks the registry (which axes
split the batch, which cuts the layers, which the rules lay out over), so a new axis is a module
of its own and no core file changes."""

from __future__ import annotations

import ast
from pathlib import Path

import jaxpar
from jaxpar import axes


# Where a registered axis's name may stand as a string in the core: strategy names that are
# spelled like an axis ("data", "tensor": a strategy, not an axis), config keys ("data" is the
# dataset's section) and a table's column headings ("stage": a pipeline stage's number).
# Everywhere else the core asks the registry (axes.of_role, ...).
def _strategy_or_key(node, parents) -> bool:
    parent = parents.get(node)
    while isinstance(parent, ast.IfExp):  # return "pmap" if ... else "data"
        node, parent = parent, parents.get(parent)
    if isinstance(parent, ast.FormattedValue):  # f"{'stage':>5}": a table's column heading
        return True
    if isinstance(parent, ast.Dict) and node in parent.keys:  # STRATEGIES = {"data": ...}
        return True
    if isinstance(parent, ast.Assign):  # name = "data"; config.strategy = "data"
        targets = [
            t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", "") for t in parent.targets
        ]
        return any(t in ("name", "strategy") for t in targets)
    if isinstance(parent, ast.Return):  # parallel.choose returns a strategy name
        return _enclosing(node, parents) == "choose"
    if isinstance(parent, ast.Compare):  # config.strategy == "tensor"
        return "strategy" in ast.unparse(parent)
    if isinstance(parent, ast.Call):  # _get(config, "data", None): the config's data section
        return ast.unparse(parent.func) in ("_get", "config.get")
    return False


def _enclosing(node, parents) -> str:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef):
            return node.name
    return ""


def _docstrings(tree) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(body[0].value)
    return out


def axis_names_in_core(root: Path) -> list[str]:
    """Every string literal in jaxpar/ outside jaxpar/axes/ that is exactly a registered axis's
    name, but for the strategy names and config keys above: file:line and the name."""
    found = []
    registered = set(axes.names())
    for path in sorted(root.rglob("*.py")):
        if "axes" in path.relative_to(root).parts[:1]:
            continue
        tree = ast.parse(path.read_text())
        parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and node.value in registered
                and node not in docs
                and not _strategy_or_key(node, parents)
            ):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.value!r}")
    return found


def test_the_core_never_names_an_axis(tmp_path):
    """The core (jaxpar/ outside jaxpar/axes/) holds no registered axis's name as a string: it
    asks the registry. The check itself finds one planted in a copy of a core module."""
    root = Path(jaxpar.__file__).parent
    assert axis_names_in_core(root) == []
    planted = tmp_path / "jaxpar"
    planted.mkdir()
    (planted / "analysis.py").write_text(
        (root / "analysis.py").read_text() + '\nREPLICAS = "+".join(["data"]) or "fsdp"\n'
    )
    assert sorted(f.split(" ")[1] for f in axis_names_in_core(planted)) == ["'data'", "'fsdp'"]
