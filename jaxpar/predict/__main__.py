"""`python -m jaxpar.predict --profile PROFILE [--config FILE | --suite FILE] [--config.KEY=V]`

Predicts, for every row of a suite (or one config), the step time split into compute, exposed
communication and bubble, images/sec, speedup and efficiency against the 1-device row, and
memory per device against the profile's capacity; then prints the recommendation line.
Nothing runs on the predicted hardware: programs are compiled with abstract inputs, for the
profile's GPU where it names one (XLA:GPU's compile-only devices, gputarget.py), else on
simulated CPU devices (16 by default here, enough for every shipped profile).

A suite is a config file whose `get_config()` holds `base` (an experiment config file),
`overrides` ({dotted key: value} for every row) and `rows` (each {"name", "config"}), the
format of `configs/bench/*.py`. `--config.KEY=VALUE` applies to every row.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import sys
from pathlib import Path

from jaxpar import compile_cache, configfile, log, oneline
from jaxpar.files import write_json, write_text
from jaxpar.predict import PredictedRow, load_profile, predict_rows, recommend, with_references
from jaxpar.predict.calibrate import from_runs, micro, on_device, sources
from jaxpar.predict.comm import cpulinks
from jaxpar.predict.profiles import fitting, hardware
from jaxpar.predict.programs import gputarget
from jaxpar.predict.step import pipelinehost, pricing
from jaxpar.predict.validation import report
from jaxpar.suites import load_rows

# Before JAX starts its backends (importing it, as jaxpar.predict does, is fine): unless
# XLA_FLAGS or JAX_PLATFORMS already say otherwise, 16 simulated CPU devices, no accelerator
# (but --calibrate-here, which measures the device this machine has).
configfile.set_host_device_count(16)
if "--calibrate-here" not in sys.argv:  # that one times this machine's own device
    configfile.cpu_only()


def table(rows: list[PredictedRow]) -> str:
    """A markdown table of the predicted rows."""
    ref = any(r.reference_images_per_sec or r.reference_efficiency for r in rows)
    head = (
        "| row | mesh | img/s | speedup | eff. | step ms | compute | comm | bubble | "
        "GiB/device | fits |" + (" reference img/s | ref. eff. | eff. - ref. |" if ref else "")
    )
    lines = [head, "|" + "---|" * (14 if ref else 11)]
    for r in rows:
        if not r.ok:
            lines.append(f"| {r.name} | - | failed: {r.error} |" + " |" * 8)
            continue
        sp = f"{r.speedup:.2f}" if r.speedup is not None else "-"
        ef = f"{100 * r.efficiency:.1f}%" if r.efficiency is not None else "-"
        lines.append(
            f"| {r.name} | {tuple(r.mesh_shape)} | {r.images_per_sec:,.1f} | {sp} | "
            f"{ef} | {_ms(r.step_time_s)} | {_ms(r.compute_s)} | "
            f"{_ms(r.comm_s)} | {_ms(r.bubble_s)} | "
            f"{r.memory_bytes_per_device / 2**30:.2f} | {'yes' if r.fits else 'NO'} |"
            + (_reference(r) if ref else "")
        )
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    """Milliseconds, with more digits for sub-millisecond figures."""
    return f"{1e3 * seconds:.1f}" if seconds >= 1e-3 or seconds == 0 else f"{1e3 * seconds:.3f}"


def _reference(r: PredictedRow) -> str:
    got, eff = r.reference_images_per_sec, r.reference_efficiency
    if not got and not eff:
        return " - | - | - |"
    delta = f"{100 * (r.efficiency - eff):+.1f} pt" if eff and r.efficiency else "-"
    shown = f"{got:,.1f}" if got else "-"
    return f" {shown} | {100 * eff:.1f}% | {delta} |" if eff else f" {shown} | - | - |"


def _parser() -> argparse.ArgumentParser:
    """The command line: every option but the `--config.KEY=VALUE` overrides."""
    parser = argparse.ArgumentParser(
        prog="python -m jaxpar.predict",
        usage="%(prog)s --profile PROFILE [--config FILE | --suite FILE] [--config.KEY=VALUE ...]"
        " [options]",
        description=__doc__.split("\n\n", 1)[1],  # all of it but the usage line
        epilog=configfile.OVERRIDES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profile", action="append", default=[], help="configs/hardware/*.py (repeatable)"
    )
    parser.add_argument("--config", help="one experiment config file")
    parser.add_argument("--suite", help="a suite file (base, overrides, rows)")
    parser.add_argument("--overlap", type=float, help="override the profile's overlap (0..1)")
    parser.add_argument(
        "--loader_images_per_sec",
        type=float,
        help="cap every row at the input pipeline's images/sec (the bench measures it per row)",
    )
    parser.add_argument("--out", help="write predictions.json and predictions.csv here")
    parser.add_argument(
        "--calibrate",
        nargs="+",
        metavar="SOURCE",
        help="fit the profile's "
        "costs (--fit) to single-device runs: bench sweeps' 1-device rows, or "
        "files listing runs",
    )
    parser.add_argument(
        "--fit",
        default="compute_efficiency",
        help="comma-separated costs to fit with --calibrate (fitting.FITTABLE)",
    )
    parser.add_argument(
        "--pool",
        action="store_true",
        help="with --calibrate: measure this "
        "machine's compute_pool, links, narrow_width and kernel_s (simulated CPU "
        "devices; kernel_s is priced with, not fitted, unless --fit names it)",
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="report every profile's (or each --profile's) errors on figures it was not fitted to",
    )

    on_device.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:

    log.setup()  # jaxpar's own lines (the trainer's, a calibration's) on stdout
    compile_cache.enable()  # programs compiled before (CPU ones) load from disk

    args, rest = _parser().parse_known_args(argv)
    if args.calibrate:
        return _calibrate(args)
    if args.validate:
        return _validate(args)
    if args.calibrate_here:
        return on_device.run(args)
    if not args.profile:
        oneline.print_error("--profile is required (configs/hardware/*.py)")
        return 2
    overrides, unknown = configfile.split_overrides(rest)
    if unknown:
        oneline.print_error(f"unknown argument {unknown[0]!r}; use --config.KEY=VALUE")
        return 2
    try:
        profiles = [load_profile(p) for p in args.profile]
        if args.loader_images_per_sec:
            profiles = [
                hardware.replace(p, loader_images_per_sec=args.loader_images_per_sec)
                for p in profiles
            ]
        configs = load_rows(args.config, args.suite, overrides)
        named = [(name, config) for name, config, _ in configs]
        say = _say if len(named) > 1 else None  # one row: its table is the progress
        references = [ref for _, _, ref in configs]
        results = [
            (p, with_references(predict_rows(named, p, args.overlap, say=say), references))
            for p in profiles
        ]
    except ValueError as e:
        oneline.print_error(oneline.first_line(e))
        return 2
    refused = {r.error for _, rows in results for r in rows if r.status == "failed"}
    if len(named) == 1 and len(refused) == 1 and not any(r.ok for _, rs in results for r in rs):
        oneline.print_error(refused.pop())  # one config the trainer refuses: what it would say
        return 2
    for profile, rows in results:
        _report(profile, rows, profile.links.overlap if args.overlap is None else args.overlap)
    if args.out:
        _write(
            Path(args.out),
            [
                dataclasses.replace(r, profile_file=f)
                for f, (_, rs) in zip(args.profile, results)
                for r in rs
            ],
        )
    return 0


def _report(profile, rows: list[PredictedRow], overlap: float | None) -> None:
    """One profile's predictions on the console: its costs, the table, the recommendation."""
    conv3x3 = (
        f", 3x3 convolutions at {profile.compute.conv3x3_efficiency:.3f}"
        if profile.compute.conv3x3_efficiency
        else ""
    )
    per_kernel = (
        f", host {profile.host.launch_s * 1e6:.1f} us per kernel launched"
        if profile.host.launch_s
        else ""
    )
    print(
        f"\npredicted on {profile.name}: matmuls at {profile.compute.compute_efficiency:.3f} x "
        f"peak ({pricing.flops_per_s(profile, 'float32') / 1e12:.2f} TFLOP/s float32){conv3x3}"
        f"{per_kernel}, gradient all-reduce overlap "
        f"{'as the program schedules it' if overlap is None else f'{overlap:g}'}"
    )
    print(f"  {gputarget.programs_line(gputarget.of(profile))}")
    for model in sorted({r.model for r in rows} & set(profile.compute.model_runs)):
        print(
            f"  {model}: its own calibration run, {pricing.efficiency(profile, model):.3f} x peak"
        )
    print(table(rows))
    print(recommend(rows))


def _write(out: Path, predicted: list[PredictedRow]) -> None:
    """predictions.json and predictions.csv (the flat fields) under `out`."""
    rows = [r.as_record() for r in predicted]
    out.mkdir(parents=True, exist_ok=True)
    write_json(str(out / "predictions.json"), {"rows": rows}, default=str)
    keys = sorted({k for r in rows for k, v in r.items() if not isinstance(v, dict)})
    buf = io.StringIO()
    writer = csv.DictWriter(buf, keys, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_text(str(out / "predictions.csv"), buf.getvalue())


def _say(line: str) -> None:
    """A progress line, on stderr: stdout stays the tables."""
    print(line, file=sys.stderr, flush=True)


def _validate(args) -> int:
    """--validate: the leave-one-model-out, published-table and measured-here report, each
    profile's part printed as it is done (every profile: about 20 minutes on 2 cores)."""

    try:
        text = report.run(args.profile or None, say=_say, emit=lambda part: print(part, flush=True))
    except (ValueError, OSError) as e:  # ConfigError, a missing file
        oneline.print_error(oneline.first_line(e))
        return 2
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_text(str(Path(args.out) / "validation.md"), text + "\n")
    return 0


def _calibrate(args) -> int:
    """--calibrate: fit, report each run's fit and the cross-model check, optionally --pool."""

    try:
        (profile,) = [load_profile(p) for p in args.profile[:1]]
        runs = [r for out in args.calibrate for r in sources.runs_from(out)]
        names = tuple(n.strip() for n in args.fit.split(",") if n.strip())
        if args.pool:  # first: its one-device runs at smaller batches join the fit
            pool = from_runs.measure_pool(runs[0])
            print(from_runs.pool_report(runs[0], pool))
            runs += from_runs.pool_runs(runs[0], pool)
            print(cpulinks.links_report(cpulinks.measure_links()))
            found = micro.measure_narrow()  # priced before the fit: it moves the rates
            print(micro.narrow_report(found))
            print(
                pipelinehost.host_report(
                    pipelinehost.measure_host(runs[0]), profile.host.step_overhead_s
                )
            )
            profile = hardware.replace(profile, narrow_width=found.narrow_width)
            kernel = micro.measure_kernel()
            print(micro.kernel_report(kernel))
            print(cpulinks.collective_cpu_report(cpulinks.measure_collective_cpu()))
            if "kernel_s" not in names:  # measured, not fitted: the fit prices with it
                profile = hardware.replace(profile, kernel_s=kernel.kernel_s)
        print(from_runs.report(profile, runs, names))
        if args.pool:  # its price at the rates just fitted
            fitted = fitting.fit(profile, runs, names).profile
            print(micro.forward_report(fitted, micro.measure_forward(runs[0])))
    except ValueError as e:
        oneline.print_error(oneline.first_line(e))
        return 2
    return 0


if __name__ == "__main__":
    oneline.run_main(main, "stopped; nothing was written (--out is written at the end)")
