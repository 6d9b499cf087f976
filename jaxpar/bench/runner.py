"""The sweep: run every row of a suite in its own process, repeats interleaved round-robin,
record each row's result as it finishes, resume from what --out already holds."""

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

from jaxpar.bench import results as results_lib
from jaxpar.bench import suite as suite_lib
from jaxpar.bench.row import write_json


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

    def _paths(self, name: str, r: int) -> tuple[str, str, str]:
        base = f"{suite_lib.slug(name)}.r{r}"
        return (
            os.path.join(self.out, "rows", f"{base}.json"),
            os.path.join(self.out, "logs", f"{base}.log"),
            os.path.join(self.out, "runs", base),
        )

    def _done(self, name: str, r: int, print_: str) -> dict | None:
        """The stored record of (row, repeat) if it was measured with this very config."""
        path = self._paths(name, r)[0]
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        if record.get("fingerprint") != print_:
            return None
        if record.get("status") != "ok" and self.retry_failed:
            return None
        return record

    def _fingerprint(self, spec, r: dict) -> str:
        try:
            return suite_lib.fingerprint(suite_lib.row_config(spec, r, self.overrides))
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            return f"unbuildable: {e}"  # the row's process fails the same way, recorded

    def run(self) -> list[dict]:
        spec = suite_lib.load_suite(self.suite)
        rows = [r for r in spec.rows if re.search(self.only, r["name"])]
        suite_lib.check_overrides(spec, self.overrides)
        for sub in ("rows", "logs", "runs"):
            os.makedirs(os.path.join(self.out, sub), exist_ok=True)
        prints = {r["name"]: self._fingerprint(spec, r) for r in rows}
        records: dict[str, list[dict]] = {r["name"]: [] for r in rows}
        todo = []
        for rep in range(self.repeat):  # round-robin: machine drift hits every row alike
            for r in rows:
                done = self._done(r["name"], rep, prints[r["name"]])
                if done is not None:
                    records[r["name"]].append(done)
                elif not any(x.get("status") != "ok" for x in records[r["name"]]):
                    todo.append((rep, r))
        skipped = sum(len(v) for v in records.values())
        print(
            f"jaxpar.bench: suite {self.suite}, {len(rows)} rows x {self.repeat} repeats -> "
            f"{self.out}" + (f" ({skipped} already measured: skipped)" if skipped else ""),
            flush=True,
        )
        t0 = time.perf_counter()
        previous = _stop_on_sigterm()
        try:
            for i, (rep, r) in enumerate(todo):
                if any(x.get("status") != "ok" for x in records[r["name"]]):
                    continue  # a row that failed once is not repeated
                record = self._run_one(r, rep, prints[r["name"]])
                records[r["name"]].append(record)
                self._write(rows, records)
                print(
                    _progress(i + 1, len(todo), time.perf_counter() - t0, r["name"], rep, record),
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

    def _run_one(self, r: dict, rep: int, print_: str) -> dict:
        result, log, _ = self._paths(r["name"], rep)
        if os.path.exists(result):
            os.remove(result)
        cmd = [
            sys.executable,
            "-m",
            "jaxpar.bench",
            "--_row",
            r["name"],
            "--_repeat",
            str(rep),
            "--suite",
            self.suite,
            "--out",
            self.out,
        ]
        cmd += [f"--config.{k}={v!r}" for k, v in self.overrides.items()]
        if self.profile:
            cmd.append("--profile")
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([suite_lib.ROOT, os.environ.get("PYTHONPATH", "")]),
        )
        if self.xla_cache:  # rows share stage programs (gpipe and 1f1b compile the same ones)
            env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(self.out, "xla-cache"))
            env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
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
        record["fingerprint"] = print_
        record["log"] = log
        write_json(result, record)
        return record

    def _write(self, rows: list[dict], records: dict[str, list[dict]], final: bool = False):
        """results.json, .csv and .md from every record so far (atomic writes)."""
        table = results_lib.add_scaling(
            [results_lib.aggregate(r, records[r["name"]]) for r in rows if records[r["name"]]]
        )
        machine = _machine(records)
        write_json(
            os.path.join(self.out, "results.json"),
            {"suite": self.suite, "machine": machine, "note": results_lib.HEADER, "rows": table},
        )
        _write_text(os.path.join(self.out, "results.csv"), results_lib.to_csv(table))
        _write_text(os.path.join(self.out, "results.md"), results_lib.markdown(table, machine))
        if final:  # the end of the sweep: the table, and the plots unless turned off
            print("\n" + results_lib.markdown(table, machine))
            if self.plots:
                from jaxpar import plots as plots_lib  # matplotlib only at the end

                made = plots_lib.plot_all(table, self.out)
                print("plots: " + ", ".join(made) if made else "plots: none for these rows")
            print(f"results: {self.out}/results.json, results.csv, results.md")
        return table


def _stop_on_sigterm():
    """SIGTERM stops the sweep like Ctrl-C: the row in flight (its own process group) is
    killed and the results so far stay on disk. Returns the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, stop)


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _machine(records: dict[str, list[dict]]) -> str:
    for reps in records.values():
        for r in reps:
            if m := r.get("machine"):
                return (
                    f"{m['devices_present']} {m['backend']} devices ({m['device_kind']}) on "
                    f"{m['cpu_cores']} CPU cores, JAX {m['jax']}"
                )
    return ""


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


def _progress(done: int, total: int, elapsed: float, name: str, rep: int, record: dict) -> str:
    from jaxpar.metrics import format_seconds

    width = 20
    fill = round(width * done / total)
    eta = elapsed / done * (total - done)
    head = (
        f"[{'#' * fill}{'.' * (width - fill)}] {done}/{total}  {format_seconds(elapsed)} "
        f"elapsed  ETA {format_seconds(eta)}  | {name} (repeat {rep}): "
    )
    if record.get("status") != "ok":
        return head + f"FAILED: {record.get('error')}"
    nan = float("nan")
    return head + (
        f"ok  {record.get('images_per_sec', nan):,.1f} img/s  "
        f"step {record.get('step_time_median_s', nan):.3f} s  "
        f"compile {record['compile_time_s']:.1f} s  eval acc {record['eval_accuracy']:.3f}"
    )
