"""A benchmark's table as a data file: CSV or JSON by the path's extension.

JSON holds {"command": the command line that made it, "rows": [...]}; CSV holds the rows under
a header line (the page that shows it names the command). Used by the benchmarks' `--out`.
"""

from __future__ import annotations

import csv
import io
import os
import shlex
import sys

from jaxpar import files


def command() -> str:
    """The command line this process runs, as a user would type it."""
    return shlex.join(["python", *sys.argv])


def write(path: str, rows: list[dict]) -> None:
    """Write `rows` (dicts with the same keys) to `path`: .csv or .json, in one step
    (jaxpar/files.py)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if path.endswith(".json"):
        files.write_json(path, {"command": command(), "rows": rows})
    elif path.endswith(".csv"):
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
        files.write_text(path, buf.getvalue())
    else:
        raise SystemExit(f"--out {path}: name a .csv or a .json file")
    print(f"wrote {path}")
