"""`python -m jaxpar.plan --config FILE --profile PROFILE [--memory_gib G] [--top N] [--devices N]
[--all_sync] [--splits flops,params] [--expand 3] [--axes data,fsdp,stage,tensor]
[--max_candidates 40] [--measure K] [--out DIR]
[--target-accuracy A [--from-run WORKDIR_OR_JSON] [--batches 64,256,1024]]
[--config.KEY=VALUE ...]`

Ranks the partitionings of one config on a hardware profile by predicted step time: every
mesh of the profile's devices over the registered axes, the pipeline schedules, micro-batch
counts, recomputation and virtual stages the trainer runs, and the synchronisation modes that
compute the single-device function (with --all_sync also the approximate ones, flagged).
Round 1 predicts one default setting per mesh, round 2 expands the best --expand meshes,
round 3 combines their best settings; at most --max_candidates predictions. Prints the top
--top that fit the memory limit, the fastest that do not, and the command that runs the best.
--measure K runs the top K on this machine (the bench) and compares. Nothing runs on the
predicted hardware: programs are compiled with abstract inputs, for the profile's GPU where it
names one (XLA:GPU's compile-only devices), else on simulated CPU devices.

With --target-accuracy the candidates are also ranked by predicted time to that accuracy:
the search runs at each global batch of --batches (default: the reference's x 1/4, 1, 4, 16
and the config's own), and each candidate's predicted steps to the target (from the reference
run's noise trace, jaxpar/target/) times its predicted step time orders them.
--from-run names the reference: a finished run's workdir or a JSON file of the same figures
(docs/time_to_target.md); without it the config itself is first trained to the target on this
machine (a calibration run in OUT/calibration).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from jaxpar import axes as axes_lib
from jaxpar import compile_cache, configfile, log, oneline
from jaxpar.errors import ConfigError
from jaxpar.files import write_json
from jaxpar.plan import measure, target_pass
from jaxpar.plan.candidates import SPLITS
from jaxpar.plan.report import report
from jaxpar.plan.search import Search, rank
from jaxpar.predict import load_profile
from jaxpar.predict.programs import gputarget
from jaxpar.target import reading


def _load_config(path: str, overrides: dict):
    try:
        config = configfile.load(path)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    try:
        configfile.override(config, overrides)
    except (KeyError, TypeError) as e:
        raise ConfigError(oneline.joined(e)) from None
    return config


def _profile_devices(path: str) -> int:
    """The profile's device count, read without starting JAX (to size the simulated devices)."""
    try:
        return int(configfile.load(path).num_devices)
    except FileNotFoundError:
        raise ConfigError(f"no such profile file {path!r} (see configs/hardware/)") from None


def extra_overrides(overrides: dict, n: int, profile) -> dict:
    """The command line's own overrides, plus num_devices when planning for fewer devices."""
    extra = dict(overrides)
    if n < profile.device.num_devices:
        extra["num_devices"] = n
    return extra


def main(argv: list[str] | None = None) -> int:
    log.setup()  # jaxpar's lines (a measured candidate's sweep) on stdout
    compile_cache.enable()  # programs compiled before (CPU ones) load from disk
    parser = argparse.ArgumentParser(
        prog="python -m jaxpar.plan",
        usage="%(prog)s --config FILE --profile PROFILE [--config.KEY=VALUE ...] [options]",
        description=__doc__.split("\n\n")[1],
        epilog=configfile.OVERRIDES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="experiment config file")
    parser.add_argument("--profile", required=True, help="configs/hardware/*.py")
    parser.add_argument("--devices", type=int, help="plan for N devices (<= the profile's)")
    parser.add_argument("--memory_gib", type=float, help="memory limit per device (GiB)")
    parser.add_argument("--top", type=int, default=5, help="rows of the ranked table")
    parser.add_argument(
        "--all_sync",
        action="store_true",
        help="also approximate sync modes (local_sgd, async, independent)",
    )
    parser.add_argument(
        "--splits",
        default="flops",
        help="pipeline split policies, comma-separated (flops,params,uniform)",
    )
    parser.add_argument("--expand", type=int, default=3, help="meshes round 2 expands")
    parser.add_argument(
        "--axes",
        default="",
        help="mesh axes to enumerate, comma-separated (default: every registered "
        "axis; node is added on a profile of several nodes)",
    )
    parser.add_argument("--max_candidates", type=int, default=40, help="predictions at most")
    parser.add_argument("--measure", type=int, default=0, help="run the top K on this machine")
    parser.add_argument("--measure_steps", type=int, default=20, help="steps per measured row")
    parser.add_argument("--out", help="write OUT/plan.json (and the measurement) here")
    parser.add_argument(
        "--target-accuracy",
        "--target_accuracy",
        type=float,
        dest="target_accuracy",
        help="rank by predicted time to this accuracy",
    )
    parser.add_argument(
        "--from-run",
        "--from_run",
        dest="from_run",
        help="the reference run: a workdir or a JSON file (docs/time_to_target.md)",
    )
    parser.add_argument(
        "--calibrate-sync",
        "--calibrate_sync",
        dest="calibrate_sync",
        nargs="?",
        const="",
        help="measure the approximate sync modes' step factors on this model first (paired "
        "runs to the target: MODE:SETTING,..., default local_sgd at sync.period and async at "
        "sync.max_staleness), kept beside the reference",
    )
    parser.add_argument(
        "--batches",
        default="",
        help="global batches to rank at, comma-separated (default: the "
        "reference's x 1/4, 1, 4, 16 and the config's)",
    )
    args, rest = parser.parse_known_args(argv)
    overrides, unknown = configfile.split_overrides(rest)
    if unknown:
        oneline.print_error(f"unknown argument {unknown[0]!r}; use --config.KEY=VALUE")
        return 2
    try:
        return _main(args, overrides)
    except ValueError as e:  # ConfigError and friends
        oneline.print_error(oneline.first_line(e))
        return 2


def _main(args, overrides: dict) -> int:
    n_profile = _profile_devices(args.profile)
    splits = tuple(s for s in args.splits.split(",") if s)
    for s in splits:
        if s not in SPLITS:
            raise ConfigError(f"--splits {s!r}: use {', '.join(SPLITS)} ('time' needs a timed run)")
    if args.devices is not None and not 1 <= args.devices <= n_profile:
        raise ConfigError(f"--devices {args.devices}: the profile has {n_profile} devices")
    for flag in ("top", "expand", "max_candidates", "measure_steps"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag} must be >= 1")
    if args.target_accuracy is not None and not 0 < args.target_accuracy <= 1:
        raise ConfigError(f"--target-accuracy {args.target_accuracy}: use a value in (0, 1]")
    if args.from_run and args.target_accuracy is None:
        raise ConfigError("--from-run needs --target-accuracy (the accuracy the run reached)")
    if args.calibrate_sync is not None and args.target_accuracy is None:
        raise ConfigError("--calibrate-sync needs --target-accuracy (the target to run to)")
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        raise ConfigError(f"--batches {args.batches!r}: comma-separated integers") from None
    if any(b < 1 for b in batches):
        raise ConfigError(f"--batches {args.batches!r}: each batch must be >= 1")
    reference = None
    if args.from_run:  # before any compile: a bad reference is one line at once
        reference = reading.load(args.from_run, args.target_accuracy)
    names = tuple(a.strip() for a in args.axes.split(",") if a.strip()) or None
    for a in names or ():
        if not axes_lib.registered(a):
            raise ConfigError(f"--axes {a!r}: choose from {', '.join(axes_lib.names())}")
    # Before JAX starts its backends: enough simulated CPU devices for the profile.
    configfile.set_host_device_count(max(16, n_profile))
    configfile.cpu_only()
    config = _load_config(args.config, overrides)

    profile = load_profile(args.profile)
    n = args.devices or profile.device.num_devices
    limit = args.memory_gib * 2**30 if args.memory_gib else profile.device.memory_bytes
    print(
        f"planning {args.config} ({config.model.name} width {config.model.width:g}, global "
        f"batch {config.global_batch_size}) on {profile.name}: {n} devices, "
        f"{limit / 2**30:.2f} GiB per device",
        flush=True,
    )
    print(f"  {gputarget.programs_line(gputarget.of(profile))}", flush=True)
    search = Search(
        profile, n, limit, args.all_sync, splits, args.expand, args.max_candidates, names
    )
    result = search.run(config)
    text, recommendation, cmd = report(
        result,
        profile,
        limit,
        args.top,
        args.config,
        config,
        extra_overrides(overrides, n, profile),
        args.expand,
        args.max_candidates,
    )
    print(text)
    fitting, too_big = rank(result.rows, limit)
    out = Path(args.out) if args.out else None
    to_target = None
    if args.target_accuracy is not None:
        if reference is None:
            out = out or Path(tempfile.mkdtemp(prefix="jaxpar-plan-"))
            reference = target_pass.calibrate(
                args.config, config, overrides, args.target_accuracy, out
            )
        if args.calibrate_sync is not None:
            reference = target_pass.calibrate_sync(
                config, args.calibrate_sync, args.target_accuracy, reference, out
            )
        to_target = target_pass.rank_to_target(
            config, search, result, args.target_accuracy, reference, batches, args.top
        )
    measured = None
    if args.measure and fitting:
        out = out or Path(tempfile.mkdtemp(prefix="jaxpar-plan-"))
        runnable = [r for r in fitting if r.predicted.num_devices <= config.host_device_count]
        top = runnable[: args.measure]
        measured = measure.measure(
            args.config, config, overrides, top, args.profile, profile, out, args.measure_steps
        )
    if out:
        out.mkdir(parents=True, exist_ok=True)
        write_json(
            str(out / "plan.json"),
            {
                "config": args.config,
                "overrides": overrides,
                "profile": args.profile,
                "num_devices": n,
                "memory_limit_bytes": limit,
                "rows": [r.as_record() for r in result.rows],
                "ranked": [r.name for r in fitting],
                "not_fitting": [r.name for r in too_big],
                "refused": [
                    {"candidate": c.as_dict(), "reason": why_not} for c, why_not in result.refused
                ],
                "recommendation": recommendation,
                "command": cmd,
                "measured": None if measured is None else [m.as_record() for m in measured],
                **(to_target.as_record() if to_target else {}),
            },
            default=str,
        )
        print(f"\nwrote {out / 'plan.json'}")
    return 0


INTERRUPTED = (
    "stopped; OUT/plan.json is written only when the plan is done (what --measure "
    "measured so far stays in OUT/measured)"
)

if __name__ == "__main__":
    oneline.run_main(main, INTERRUPTED)
