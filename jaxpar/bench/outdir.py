"""What a sweep's OUT holds: OUT/sweep.json (what it is measured under: `claim`), and one
record per (row, repeat) in OUT/rows with its log and run (`paths`, `stored`); a record made
under another config of its row goes to OUT/replaced/ (`set_aside`), never overwritten."""

from __future__ import annotations

import json
import os
import re

from jaxpar import suites as suite_lib
from jaxpar.bench.records import Manifest, Repeat
from jaxpar.files import write_json

MANIFEST = "sweep.json"


class Refused(ValueError):
    """The sweep will not run as asked; one line for the user, nothing in OUT touched."""


def paths(out: str, name: str, r: int) -> tuple[str, str, str]:
    """Row `name`'s repeat `r`: its record, its log and its run's workdir."""
    base = f"{suite_lib.slug(name)}.r{r}"
    return (
        os.path.join(out, "rows", f"{base}.json"),
        os.path.join(out, "logs", f"{base}.log"),
        os.path.join(out, "runs", base),
    )


def stored(out: str, name: str) -> dict[int, Repeat]:
    """Every stored record of row `name` (any fingerprint), by repeat."""
    rows_dir = os.path.join(out, "rows")
    pattern = re.escape(suite_lib.slug(name)) + r"\.r(\d+)\.json"
    found = {}
    for file in sorted(os.listdir(rows_dir)):
        if match := re.fullmatch(pattern, file):
            found[int(match.group(1))] = Repeat.of_record(read(os.path.join(rows_dir, file)))
    return found


def set_aside(out: str, name: str, rep: int, fingerprint: str) -> None:
    """Move a record (with its log and run) made under another config of this row to
    OUT/replaced/ before the row is measured again: kept apart, never overwritten."""
    path, log, run = paths(out, name, rep)
    if not os.path.exists(path):
        return
    old = read(path)  # the record as stored, every key kept
    was = Repeat.of_record(old).fingerprint
    if was == fingerprint:
        return
    base = _free(os.path.join(out, "replaced", f"{os.path.basename(run)}.{_tag(was)}"))
    os.makedirs(os.path.dirname(base), exist_ok=True)
    if os.path.exists(log):
        moved = old["log"] = f"{base}.log"
        os.replace(log, moved)
    if os.path.exists(run):
        os.replace(run, f"{base}.run")
    write_json(f"{base}.json", old)
    os.remove(path)
    print(
        f"{name} (repeat {rep}): its config changed since it was measured; the old record "
        f"is in {base}.json",
        flush=True,
    )


def claim(out: str, suite: str, overrides: dict) -> None:
    """Record in OUT/sweep.json what OUT is measured under, or refuse a sweep under other
    settings: rows measured with different overrides must not mix in one table."""
    path = os.path.join(out, MANIFEST)
    mine = Manifest(suite=suite_lib.suite_id(suite), overrides=suite_lib.plain(overrides))
    if not os.path.exists(path):
        if os.path.isdir(os.path.join(out, "rows")):  # made before OUT had a manifest
            print(
                f"{path}: recorded now; rows measured under other settings run again",
                flush=True,
            )
        os.makedirs(out, exist_ok=True)
        write_json(path, mine.as_record())
        return
    theirs = Manifest.of_record(read(path))
    if theirs.suite != mine.suite:
        raise Refused(
            f"--out {out} holds suite {theirs.suite}, not {mine.suite}; "
            f"pass --suite {theirs.suite}, or choose another --out"
        )
    if theirs.overrides != mine.overrides:
        differ = suite_lib.differences(theirs.overrides or {}, mine.overrides)
        raise Refused(
            f"--out {out} was measured with other overrides ({differ}); pass the same "
            "--config overrides, or choose another --out"
        )


def read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _tag(fingerprint: str | None) -> str:
    """The file-name tag of a replaced record: its fingerprint (or 'old')."""
    found = str(fingerprint if fingerprint is not None else "")
    return found if re.fullmatch(r"[0-9a-f]{12}", found) else "old"


def _free(base: str) -> str:
    """`base`, or `base.2`, `base.3`... : the first whose .json does not exist yet."""
    candidate, n = base, 1
    while os.path.exists(f"{candidate}.json"):
        n += 1
        candidate = f"{base}.{n}"
    return candidate
