"""Whole-file writes that a reader (or a Ctrl-C, or a killed process) never sees half done:
write beside the target, then rename over it (atomic on POSIX within one file system)."""

from __future__ import annotations

import json
import os
from typing import Any


def write_text(path: str, text: str) -> None:
    """Replace the file at `path` with `text` in one step."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path: str, value: Any, default=None) -> None:
    """`value` as indented JSON, in one step. NumPy scalars become numbers, sets and tuples
    lists, anything else its str(); `default` replaces that conversion."""
    write_text(path, json.dumps(value, indent=1, default=default or plain))


def plain(value: Any) -> Any:
    """A JSON-ready stand-in for `value` (json.dump's `default`)."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
