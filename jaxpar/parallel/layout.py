"""The layout-free state and a pipeline's per-chunk parts of it.

A canonical TrainState keeps every per-layer dict keyed by layer name (params, batch
statistics, optimizer moments). A pipeline chunk holds the entries of its own layers; `select`
cuts a chunk's part out of a canonical state and `merge` joins the parts back.
"""

from __future__ import annotations

from typing import Any


def merge(trees: list[Any]) -> Any:
    """Merge per-stage pytrees whose dicts hold disjoint layer names (params, optimizer state)
    into one; leaves shared by every stage (step counts) are taken from stage 0."""
    first = trees[0]
    if isinstance(first, dict):
        out: dict = {}
        for tree in trees:
            out.update(tree)
        return out
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(merge(list(parts)) for parts in zip(*trees)))
    if isinstance(first, (tuple, list)):
        return type(first)(merge(list(parts)) for parts in zip(*trees))
    if dataclass_fields := getattr(first, "__dataclass_fields__", None):
        return first.replace(**{k: merge([getattr(t, k) for t in trees]) for k in dataclass_fields})
    return first


def select(tree: Any, keep: set[str], layer_names: set[str]) -> Any:
    """The inverse of `merge`: keep only `keep`'s entries of every dict keyed by layer names."""
    if isinstance(tree, dict):
        if tree and set(tree) <= layer_names:
            return {k: v for k, v in tree.items() if k in keep}
        return {k: select(v, keep, layer_names) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(select(v, keep, layer_names) for v in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(select(v, keep, layer_names) for v in tree)
    if fields := getattr(tree, "__dataclass_fields__", None):
        return tree.replace(**{k: select(getattr(tree, k), keep, layer_names) for k in fields})
    return tree
