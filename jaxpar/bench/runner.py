"""The sweep: run every row of a suite in its own process, repeats interleaved round-robin,
record each row's result as it finishes, resume from what --out already holds.

OUT/sweep.json records the suite and the --config overrides OUT was measured under; a sweep
with others is refused before it runs. OUT/rows holds one record per (row, repeat), stamped
with the row's config fingerprint; a record whose row changed is moved to OUT/replaced/ before
the row runs again. The results files are made from every current record, whichever run made it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from jaxpar import configfile, units
from jaxpar import suites as suite_lib
from jaxpar.bench import outdir, publish
from jaxpar.bench.outdir import Refused
from jaxpar.bench.records import Repeat, Suite, SuiteRow
from jaxpar.bench.row_record import BenchRow
from jaxpar.files import write_json


@dataclasses.dataclass
class Sweep:
    suite: str  # name or path
    out: str
    repeat: int = 1
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    profile: bool = False
    row_timeout_s: float = 1800.0
    retry_failed: bool = False
    plots: bool = True
    xla_cache: bool = True  # persistent compilation cache in OUT/xla-cache
    only: str = ""  # regex: run only the rows whose name matches
    predict: str = ""  # a hardware profile: each row's prediction on it beside the measurement

    def _paths(self, name: str, r: int) -> tuple[str, str, str]:
        return outdir.paths(self.out, name, r)

    def _fingerprint(self, spec, r: SuiteRow) -> str:
        try:
            config = suite_lib.row_config(spec, r.as_record(), self.overrides)
            return suite_lib.fingerprint(config)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            return f"unbuildable: {e}"  # the row's process fails the same way, recorded

    def run(self) -> list[BenchRow]:
        """Measure the selected rows not yet measured; return the table of every stored row.
        Raises Refused (before touching OUT) for an --only that selects nothing or an OUT
        measured under another suite or other overrides."""
        spec = suite_lib.load_suite(self.suite)
        suite_lib.check_overrides(spec, self.overrides)
        suite = Suite.of_record(spec)
        self.reference_name = suite.reference_name  # the accuracy study's column
        self.predict = self.predict or suite.predict_profile
        picked = self._select(suite.rows)
        outdir.claim(self.out, self.suite, self.overrides)
        for sub in ("rows", "logs", "runs"):
            os.makedirs(os.path.join(self.out, sub), exist_ok=True)
        fingerprints, records, todo = self._plan(spec, suite.rows, picked)
        skipped = len(picked) * self.repeat - len(todo)
        some = (
            len(picked) if len(picked) == len(suite.rows) else f"{len(picked)} of {len(suite.rows)}"
        )
        print(
            f"jaxpar.bench: suite {self.suite}, {some} rows x {self.repeat} repeats -> "
            f"{self.out}" + (f" ({skipped} already measured: skipped)" if skipped else ""),
            flush=True,
        )
        rows = suite.rows  # the results hold every row with a current record, in suite order
        t0 = time.perf_counter()
        previous = _stop_on_sigterm()
        try:
            for i, (rep, r) in enumerate(todo):
                if not all(rec.ok for rec in records[r.name].values()):
                    continue  # it failed in an earlier repeat of this run: not repeated
                outdir.set_aside(self.out, r.name, rep, fingerprints[r.name])
                record = self.run_row(r, rep, fingerprints[r.name])
                records[r.name][rep] = record
                self._write(rows, records)
                print(
                    _progress(i + 1, len(todo), time.perf_counter() - t0, r.name, rep, record),
                    flush=True,
                )
        except KeyboardInterrupt:
            print(
                "\ninterrupted: results so far are in place; rerun with the same --out to resume",
                flush=True,
            )
            self._write(rows, records)
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return self._write(rows, records, final=True)

    def _plan(self, spec, rows: tuple[SuiteRow, ...], picked: list[SuiteRow]):
        """Fingerprints of every row, the current records of every row (by repeat), and the
        (repeat, row) pairs to measure, round-robin: machine drift hits every row alike."""
        fingerprints = {r.name: self._fingerprint(spec, r) for r in rows}
        names = {r.name for r in picked}
        records, stale = {}, []
        for name, fingerprint in fingerprints.items():
            stored = outdir.stored(self.out, name)
            records[name] = {k: v for k, v in stored.items() if v.fingerprint == fingerprint}
            if self.retry_failed and name in names:
                records[name] = {k: v for k, v in records[name].items() if v.ok}
            older = {k for k, v in stored.items() if v.fingerprint != fingerprint}
            for k in sorted(older - set(range(self.repeat) if name in names else ())):
                stale.append(f"{name} (repeat {k})")  # this run does not measure it again
        if stale:
            print(f"measured under an older config, left out: {', '.join(stale)}", flush=True)
        todo = [
            (k, r)
            for k in range(self.repeat)
            for r in picked
            if k not in (done := records[r.name]) and all(rec.ok for rec in done.values())
        ]  # a row that failed once is not repeated
        return fingerprints, records, todo

    def _select(self, rows: tuple[SuiteRow, ...]) -> list[SuiteRow]:
        """The rows --only picks (all without it); an --only that picks none is refused."""
        try:
            picked = [r for r in rows if re.search(self.only, r.name)]
        except re.error as e:
            raise Refused(f"--only {self.only!r} is not a regular expression: {e}") from None
        if not picked:
            name = suite_lib.suite_name(self.suite)
            raise Refused(
                f"--only {self.only!r} matches no row of suite {name}; "
                f"its rows are: {', '.join(r.name for r in rows)}"
            )
        return picked

    def run_row(self, r: SuiteRow, rep: int, fingerprint: str) -> Repeat:
        """Run row `r`, repeat `rep`, in its own process (python -m jaxpar.bench --_row) and
        return its record: the one place a sweep starts a row (tests stand in for it here)."""
        result, log, _ = self._paths(r.name, rep)
        if os.path.exists(result):
            os.remove(result)
        cmd = [
            sys.executable,
            "-m",
            "jaxpar.bench",
            "--_row",
            r.name,
            "--_repeat",
            str(rep),
            "--suite",
            self.suite,
            "--out",
            self.out,
        ]
        cmd += configfile.override_args(self.overrides)
        if self.profile:
            cmd.append("--profile")
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([suite_lib.ROOT, os.environ.get("PYTHONPATH", "")]),
        )
        if self.xla_cache:  # rows share stage programs (gpipe and 1f1b compile the same ones)
            env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(self.out, "xla-cache"))
            env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        else:  # compile_cache "auto" reads it: every row compiles cold
            env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
        with open(log, "w", encoding="utf-8") as f:
            proc = subprocess.Popen(
                cmd,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=suite_lib.ROOT,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=self.row_timeout_s)
            except (KeyboardInterrupt, subprocess.TimeoutExpired) as e:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                if isinstance(e, KeyboardInterrupt):
                    raise
                rc = None
        if os.path.exists(result):
            with open(result, encoding="utf-8") as f:
                record = json.load(f)
        else:
            record = {"status": "failed", "error": _why(rc, log, self.row_timeout_s)}
        record["fingerprint"] = fingerprint
        record["log"] = log
        write_json(result, record)
        return Repeat.of_record(record)

    def _write(
        self, rows: tuple[SuiteRow, ...], records: dict[str, dict[int, Repeat]], final=False
    ) -> list[BenchRow]:
        """The results files from every record so far (publish.py)."""
        return publish.write(self, rows, records, final)


def _stop_on_sigterm():
    """SIGTERM stops the sweep like Ctrl-C: the row in flight (its own process group) is
    killed and the results so far stay on disk. Returns the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, stop)


def _why(rc: int | None, log: str, timeout: float) -> str:
    """One line for a row that left no result: timeout, signal, or its log's last line."""
    if rc is None:
        return f"timed out after {timeout:.0f} s"
    if rc < 0:
        name = signal.Signals(-rc).name
        hint = " (out of memory?)" if -rc == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    last = ""
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                last = line.strip()
    return f"exit status {rc}: {last[:200]}"


def _progress(done: int, total: int, elapsed: float, name: str, rep: int, record: Repeat) -> str:
    width = 20
    fill = round(width * done / total)
    eta = elapsed / done * (total - done)
    head = (
        f"[{'#' * fill}{'.' * (width - fill)}] {done}/{total}  {units.clock(elapsed)} "
        f"elapsed  ETA {units.clock(eta)}  | {name} (repeat {rep}): "
    )
    r = record.figures
    if not record.ok:
        return head + f"FAILED: {r.error}"
    rate = float("nan") if r.images_per_sec is None else r.images_per_sec
    return head + (
        f"ok  {rate:,.1f} img/s  "
        f"step {units.seconds(r.step_time_median_s)}  "
        f"compile {units.seconds(r.compile_time_s)}  eval acc {r.eval_accuracy:.3f}" + _loader(r)
    )


def _loader(r: BenchRow) -> str:
    """The row line's input part: the loader's capacity, and whether it was the limit."""
    if r.loader_images_per_sec is None:
        return ""
    bound = " (input-bound)" if r.input_bound else ""
    return f"  loader {r.loader_images_per_sec:,.0f} img/s{bound}"
