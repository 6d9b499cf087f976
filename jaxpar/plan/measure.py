"""`python -m jaxpar.plan --measure K`: the top K candidates run through the bench on this
machine (a suite written to OUT/measure_suite.py, measured into OUT/measured by `python -m
jaxpar.bench` in its own process, read back from its results.json), and the predicted order
printed against the measured one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from jaxpar.bench.records import SuiteRow
from jaxpar.bench.row_record import BenchRow
from jaxpar.errors import ConfigError
from jaxpar.files import write_text
from jaxpar.plan.records import Measured, PlanRow


def measure(
    config_file: str,
    config,
    overrides: dict,
    top: list[PlanRow],
    profile_path: str,
    profile,
    out: Path,
    steps: int = 20,
) -> list[Measured]:
    """Run `top` through the bench on this machine, `steps` steps a row; print predicted
    against measured."""
    this_machine = Path(profile_path).name == "cpu_2core.py" or bool(profile.cpu.compute_pool)
    if not this_machine:
        print(
            f"note: measured figures are this machine's ({os.cpu_count()} CPU cores, simulated "
            f"devices), not {profile.name}'s: compare the order, not the numbers"
        )
    rows = []
    for r in top:
        c = r.candidate
        rows.append(
            SuiteRow(
                name=f"plan {c.name}",
                config=c.overrides(config),
                scaling="strong",
                baseline="",
                label="",
            )
        )
    common = {
        **overrides,
        "num_train_steps": steps,
        "log_every_steps": max(1, steps // 4),
        "eval_every_steps": 0,
        "checkpoint_every_steps": 0,
    }
    out.mkdir(parents=True, exist_ok=True)
    suite_file = out / "measure_suite.py"
    write_text(
        str(suite_file),
        '"""The top candidates of `python -m jaxpar.plan`, measured by the bench."""\n\n'
        "from configs.bench import suite\n\n\n"
        f"def get_config():\n    return suite({os.path.abspath(config_file)!r}, {common!r}, "
        f"{tuple(r.as_record() for r in rows)!r})\n",
    )
    print(
        f"\nmeasuring the top {len(rows)} on this machine: python -m jaxpar.bench --suite "
        f"{suite_file} --out {out / 'measured'}",
        flush=True,
    )
    got = {t.name: t for t in _bench(suite_file, out / "measured")}
    result = []
    for r, spec in zip(top, rows):
        m = got.get(spec.name)
        measured = m.images_per_sec if m is not None and m.status == "ok" else None
        err = (r.predicted.images_per_sec / measured - 1) if measured else None
        result.append(
            Measured(
                name=r.name,
                predicted_images_per_sec=r.predicted.images_per_sec,
                measured_images_per_sec=measured,
                error=err,
                measured_status=m.status if m is not None else None,
                measured_error=m.error if m is not None else None,
            )
        )
    print("\n| predicted rank | candidate | predicted img/s | measured img/s | prediction error |")
    print("|---|---|---|---|---|")
    for i, x in enumerate(result, 1):
        meas = (
            f"{x.measured_images_per_sec:,.1f}"
            if x.measured_images_per_sec
            else (f"failed: {x.measured_error}")
        )
        err = f"{100 * x.error:+.0f}%" if x.error is not None else "-"
        print(f"| {i} | {x.name} | {x.predicted_images_per_sec:,.1f} | {meas} | {err} |")
    ok = [x for x in result if x.measured_images_per_sec]
    pairs = [(a, b) for i, a in enumerate(ok) for b in ok[i + 1 :]]
    same = sum(a.measured_images_per_sec >= b.measured_images_per_sec for a, b in pairs)
    if pairs:
        verdict = "agrees with" if same == len(pairs) else "differs from"
        print(
            f"measured order {verdict} the predicted one: {same} of {len(pairs)} pairs in the "
            "same order"
        )
    return result


def _bench(suite_file: Path, out: Path) -> list[BenchRow]:
    """The bench's rows for `suite_file`, measured into `out` by `python -m jaxpar.bench` (its
    progress on this console) and read from its results.json."""
    command = [sys.executable, "-m", "jaxpar.bench", "--suite", str(suite_file)]
    done = subprocess.run([*command, "--out", str(out), "--no_plots"], check=False)
    results = out / "results.json"
    if done.returncode != 0 or not results.exists():
        raise ConfigError(
            f"the measurement stopped (python -m jaxpar.bench exited {done.returncode}); what it "
            f"measured is in {out}"
        )
    with open(results, encoding="utf-8") as f:
        return [BenchRow.of_record(r) for r in json.load(f)["rows"]]
