"""A benchmark's table as a data file: CSV or JSON by the path's extension.

JSON holds {"command": the command line that made it, "rows": [...]}; CSV holds the rows under
a header line (the page that shows it names the command). Used by the benchmarks' `--out`.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import sys


def command() -> str:
    """The command line this process runs, as a user would type it."""
    return shlex.join(["python", *sys.argv])


def write(path: str, rows: list[dict]) -> None:
    """Write `rows` (dicts with the same keys) to `path`: .csv or .json."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if path.endswith(".json"):
        with open(path, "w") as f:
            json.dump({"command": command(), "rows": rows}, f, indent=1)
            f.write("\n")
    elif path.endswith(".csv"):
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
            writer.writeheader()
            writer.writerows(rows)
    else:
        raise SystemExit(f"--out {path}: name a .csv or a .json file")
    print(f"wrote {path}")
