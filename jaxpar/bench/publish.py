"""What a sweep writes to OUT from its records: results.json, .csv and .md after every row,
with the accuracy study, the time-to-target study and the predictions beside them where the
suite has them; at the end the report printed and the plots (runner.py runs the rows)."""

from __future__ import annotations

import os

from jaxpar import oneline
from jaxpar import suites as suite_lib
from jaxpar.bench import accuracy as accuracy_lib
from jaxpar.bench import outdir, target_table
from jaxpar.bench import predicted as predicted_lib
from jaxpar.bench import results as results_lib
from jaxpar.bench import table as table_lib
from jaxpar.bench import time_to_target as ttt_lib
from jaxpar.bench.records import Repeat, Suite, SuiteRow
from jaxpar.bench.row_record import BenchRow
from jaxpar.errors import ConfigError
from jaxpar.files import write_json, write_text
from jaxpar.target import reading
from jaxpar.target.reference import Reference


def write(
    sweep,
    rows: tuple[SuiteRow, ...],
    records: dict[str, dict[int, Repeat]],
    final: bool = False,
) -> list[BenchRow]:
    """results.json, .csv and .md from every record so far (atomic writes), and the studies'
    files beside them; at the end of the sweep also the report printed and the plots. Returns
    the results table."""
    table = results_lib.add_scaling(
        [
            results_lib.aggregate(r, [reps[k] for k in sorted(reps)])
            for r in rows
            if (reps := records[r.name])
        ]
    )
    machine = _machine(records)
    table, ttt_model = _time_to_target(sweep, rows, records, table)
    predicted = False
    if final and sweep.predict:  # after the last row: the predictor's own process
        args = (table, sweep.suite, sweep.predict, sweep.overrides, sweep.out)
        merged = predicted_lib.predict_table(*args)
        predicted = merged is not None
        table = merged if predicted else table
    rows_json = [r.as_record() for r in table]
    write_json(
        os.path.join(sweep.out, "results.json"),
        {"suite": sweep.suite, "machine": machine, "note": table_lib.HEADER, "rows": rows_json},
    )
    write_text(os.path.join(sweep.out, "results.csv"), results_lib.to_csv(table))
    write_text(os.path.join(sweep.out, "results.md"), table_lib.markdown(table, machine))
    study = accuracy_lib.markdown(accuracy_lib.study(table), sweep.reference_name)
    # an accuracy study: rows outside the scaling plots that name a setting (label, seeds
    # folded) or a published figure; not every scaling="none" row (pipeline_efficiency's)
    is_study = any(r.scaling == "none" and (r.label or r.reference is not None) for r in rows)
    if is_study:
        write_text(os.path.join(sweep.out, "accuracy.md"), study)
    if ttt_model is not False:  # a time-to-target suite: its study beside the results
        write_text(
            os.path.join(sweep.out, "time_to_target.md"), target_table.markdown(table, ttt_model)
        )
        write_text(os.path.join(sweep.out, "time_to_target.csv"), target_table.to_csv(table))
        write_json(
            os.path.join(sweep.out, "time_to_target.json"),
            {
                "model": ttt_model.as_record() if ttt_model is not None else None,
                "summary": ttt_lib.summary(table).as_record(),
                "rows": [r.as_record(_TARGET_COLUMNS) for r in table],
            },
        )
    if predicted:
        write_text(
            os.path.join(sweep.out, "predicted.md"),
            predicted_lib.predicted_markdown(table, sweep.predict),
        )
    if final:  # the end of the sweep: the table, and the plots unless turned off
        print("\n" + table_lib.markdown(table, machine))
        if predicted:
            print(_read_text(os.path.join(sweep.out, "predicted.md")))
        if ttt_model is not False:
            print("time to target:\n" + _read_text(os.path.join(sweep.out, "time_to_target.md")))
        if is_study:
            print("accuracy study (rows of one setting under several seeds folded):\n" + study)
        if sweep.plots:
            from jaxpar.bench import plots as plots_lib  # matplotlib's start-up: at the end only

            made = plots_lib.plot_all(table, sweep.out)
            print("plots: " + ", ".join(made) if made else "plots: none for these rows")
        print(
            f"results: {sweep.out}/results.json, results.csv, results.md"
            + (", predicted.md" if predicted else "")
        )
    return table


# time_to_target.json's columns of each row
_TARGET_COLUMNS = (
    "name",
    "global_batch_size",
    "num_devices",
    "mesh_shape",
    "mesh_axes",
    "strategy",
    "step_time_median_s",
    *ttt_lib.KEYS,
)


def _time_to_target(sweep, rows, records, table):
    """A time-to-target suite's figures added to `table` (jaxpar.bench.time_to_target): the
    table, and the reference's model (None: no reference yet), or False for any other
    suite."""
    suite = Suite.of_record(suite_lib.load_suite(sweep.suite))
    if not suite.trains_to_target:
        return table, False
    first = {name: reps[min(reps)] for name, reps in records.items() if reps}
    return ttt_lib.annotate(
        table,
        rows,
        first,
        suite.reference_row,
        reference_of=lambda name: _reference(outdir.paths(sweep.out, name, 0)[2]),
    )


def _reference(workdir: str) -> Reference | None:
    """A row's run as the steps model's reference, or None where it cannot be one (one line
    says why)."""
    try:
        return reading.load(workdir)
    except ConfigError as e:
        print(f"time to target: no reference ({oneline.first_line(e)})")
        return None


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _machine(records: dict[str, dict[int, Repeat]]) -> str:
    for reps in records.values():
        for r in reps.values():
            if r.machine is not None:
                return r.machine.describe()
    return ""
