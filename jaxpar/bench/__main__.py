"""python -m jaxpar.bench [--suite NAME|FILE] [--out DIR] [--repeat N] [--only REGEX]
                         [--retry_failed] [--row_timeout S] [--profile] [--predict PROFILE]
                         [--config.KEY=VALUE ...]

Runs every row of a suite (default: the suite OUT was measured under, else
configs/bench/partitionings.py), each in its own process, and writes OUT/results.json,
results.csv, results.md and PNG plots. `--config.KEY=VALUE` applies to every row (a row's own
keys win).

OUT is one sweep. OUT/sweep.json records the suite and the --config overrides it is measured
under; a rerun with another suite or other overrides is refused before anything runs (pass the
same ones, or choose another --out), so one table never mixes settings. Given neither --suite
nor any --config, a rerun takes both from OUT/sweep.json. Each (row, repeat) is stored in
OUT/rows with its config's fingerprint. A rerun resumes: rows already measured with the same
config are skipped (--retry_failed runs failed ones again); a row whose config changed (the
suite file was edited) is measured again and its old record moved to OUT/replaced/.
`--only REGEX` measures the matching rows only; the results files still hold every row with a
current record, in suite order. An --only that matches no row is refused (exit status 2) and
OUT is left as it was.

Predictions. With --predict PROFILE (a configs/hardware/*.py file; or the suite's
`predict_profile`), after measuring, every row OUT holds is predicted on that hardware
(python -m jaxpar.predict in its own process; OUT/predicted/predictions.json, its log in
OUT/logs/predicted.log) and each row gets the predicted_* keys in results.json / .csv:
images/sec, step time split into compute / comm / bubble / overhead, the schedule's bubble
fraction (pipelines), memory per device, and the errors predicted_error = predicted / measured
images/sec - 1 and predicted_memory_error (against the compiled program's memory, exact).
OUT/predicted.md is the table of measured against predicted, one line per row, with the median
and mean |error|, the worst row and Spearman's rank correlation below; the plot
predicted_vs_measured.png shows the same. The profile is not part of OUT/sweep.json: it does
not change a measurement. To (re)predict a sweep already measured, run it again with a
--predict profile (any, e.g. another machine's):

    python -m jaxpar.bench --out DIR --predict configs/hardware/dgx1_p100.py

Every row DIR holds is skipped as measured (pass the same --only as before if the sweep was a
subset: without it the rows never measured would run now); only the predictions, the results
files, predicted.md and the plots are written again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from jaxpar import configfile, log, oneline
from jaxpar import suites as suite_lib
from jaxpar.bench import row as row_lib
from jaxpar.bench.outdir import MANIFEST, Refused
from jaxpar.bench.records import Manifest, Suite
from jaxpar.errors import ConfigError


def main(argv: list[str]) -> int:
    log.setup()  # jaxpar's lines (the plots', a row's trainer) on stdout
    overrides, rest = configfile.split_overrides(argv)
    parser = argparse.ArgumentParser(prog="python -m jaxpar.bench", description=__doc__)
    parser.add_argument(
        "--suite", help="name in configs/bench or path (default: OUT's, else partitionings)"
    )
    parser.add_argument("--out", default="bench-out", help="results directory (resumable)")
    parser.add_argument("--repeat", type=int, default=1, help="repeats, interleaved over rows")
    parser.add_argument("--profile", action="store_true", help="profiler trace of each row")
    parser.add_argument("--retry_failed", action="store_true", help="rerun failed rows")
    parser.add_argument("--row_timeout", type=float, default=1800.0, help="seconds per row")
    parser.add_argument("--only", default="", help="run only rows whose name matches (regex)")
    parser.add_argument("--no_xla_cache", action="store_true", help="compile every row cold")
    parser.add_argument("--no_plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--predict",
        default="",
        help="a hardware profile (configs/hardware/"
        "*.py): every row predicted on it beside the measurement",
    )
    parser.add_argument("--_row", help=argparse.SUPPRESS)  # internal: run one row
    parser.add_argument("--_repeat", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(rest)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args._row is not None:
        return _one_row(args.suite, args._row, args._repeat, args.out, overrides, args.profile)

    # the sweep imports JAX (seconds), which a --_row process may only import once it has
    # set XLA_FLAGS: here, after that branch
    from jaxpar.bench.runner import Sweep

    if args.suite is None:  # the suite (and, given no --config, the overrides) OUT holds
        args.suite, overrides = _measured_under(args.out, overrides)
    sweep = Sweep(
        suite=suite_lib.suite_path(args.suite),
        out=os.path.abspath(args.out),
        repeat=args.repeat,
        overrides=overrides,
        profile=args.profile,
        row_timeout_s=args.row_timeout,
        retry_failed=args.retry_failed,
        plots=not args.no_plots,
        only=args.only,
        xla_cache=not args.no_xla_cache,
        predict=args.predict,
    )
    try:
        sweep.run()
    except Refused as e:
        oneline.print_error(str(e))
        return 2
    except ConfigError as e:  # a suite file that is not one, a row the config refuses
        oneline.print_error(oneline.first_line(e))
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _measured_under(out: str, overrides: dict) -> tuple[str, dict]:
    """The suite OUT/sweep.json records (else partitionings) and, when the command line gives
    no --config, the overrides it records: a rerun with --out alone resumes OUT as it was."""
    path = os.path.join(out, MANIFEST)
    if not os.path.exists(path):
        return "partitionings", overrides
    with open(path, encoding="utf-8") as f:
        manifest = Manifest.of_record(json.load(f))
    suite = manifest.suite
    if not os.path.isabs(suite):
        suite = os.path.join(suite_lib.ROOT, suite)
    return suite, overrides or dict(manifest.overrides or {})


def _one_row(
    suite: str, name: str, repeat: int, out: str, overrides: dict, profile: bool = False
) -> int:
    """Row `name` of `suite`, repeat `repeat`, run in this process into OUT/runs and
    OUT/rows."""
    spec = suite_lib.load_suite(suite)
    (entry,) = [r for r in Suite.of_record(spec).rows if r.name == name]
    config = suite_lib.row_config(spec, entry.as_record(), overrides)
    base = f"{suite_lib.slug(entry.name)}.r{repeat}"
    row_lib.run_row(
        config,
        workdir=f"{out}/runs/{base}",
        result_path=f"{out}/rows/{base}.json",
        profile=profile,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
