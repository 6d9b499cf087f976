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
predicted hardware: programs are compiled with abstract inputs on simulated CPU devices.

With --target-accuracy the candidates are also ranked by predicted time to that accuracy:
the search runs at each global batch of --batches (default: the reference's x 1/4, 1, 4, 16
and the config's own), and each candidate's predicted steps to the target (from the reference
run's steps and noise scale, jaxpar/plan/steps.py) times its predicted step time orders them.
--from-run names the reference: a finished run's workdir or a JSON file of the same figures
(docs/time_to_target.md); without it the config itself is first trained to the target on this
machine (a calibration run in OUT/calibration).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from jaxpar import compile_cache, configfile, log, oneline
from jaxpar.errors import ConfigError
from jaxpar.files import write_json, write_text


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


def _measure(
    args, config_file, config, overrides, top, profile_path, profile, out: Path
) -> list[dict]:
    """Run `top` through the bench on this machine; print predicted against measured."""
    from jaxpar.bench.runner import Sweep
    from jaxpar.plan.candidates import candidate_of

    this_machine = Path(profile_path).name == "cpu_2core.py" or bool(profile.compute_pool)
    if not this_machine:
        print(
            f"note: measured figures are this machine's ({os.cpu_count()} CPU cores, simulated "
            f"devices), not {profile.name}'s: compare the order, not the numbers"
        )
    rows = []
    for r in top:
        c = candidate_of(r)
        rows.append(
            {
                "name": f"plan {c.name}",
                "config": c.overrides(config),
                "group": "",
                "scaling": "strong",
                "baseline": "",
                "label": "",
                "reference": None,
                "reference_efficiency": None,
            }
        )
    common = {
        **overrides,
        "num_train_steps": args.measure_steps,
        "log_every_steps": max(1, args.measure_steps // 4),
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
        f"{tuple(rows)!r})\n",
    )
    print(
        f"\nmeasuring the top {len(rows)} on this machine: python -m jaxpar.bench --suite "
        f"{suite_file} --out {out / 'measured'}",
        flush=True,
    )
    table_rows = Sweep(suite=str(suite_file), out=str(out / "measured"), plots=False).run()
    got = {t["name"]: t for t in table_rows}
    result = []
    for r, spec in zip(top, rows):
        m = got.get(spec["name"], {})
        measured = m.get("images_per_sec") if m.get("status") == "ok" else None
        err = (r["images_per_sec"] / measured - 1) if measured else None
        result.append(
            {
                "name": r["name"],
                "predicted_images_per_sec": r["images_per_sec"],
                "measured_images_per_sec": measured,
                "error": err,
                "measured_status": m.get("status"),
                "measured_error": m.get("error"),
            }
        )
    print("\n| predicted rank | candidate | predicted img/s | measured img/s | prediction error |")
    print("|---|---|---|---|---|")
    for i, x in enumerate(result, 1):
        meas = (
            f"{x['measured_images_per_sec']:,.1f}"
            if x["measured_images_per_sec"]
            else (f"failed: {x['measured_error']}")
        )
        err = f"{100 * x['error']:+.0f}%" if x["error"] is not None else "-"
        print(f"| {i} | {x['name']} | {x['predicted_images_per_sec']:,.1f} | {meas} | {err} |")
    ok = [x for x in result if x["measured_images_per_sec"]]
    pairs = [(a, b) for i, a in enumerate(ok) for b in ok[i + 1 :]]
    same = sum(a["measured_images_per_sec"] >= b["measured_images_per_sec"] for a, b in pairs)
    if pairs:
        verdict = "agrees with" if same == len(pairs) else "differs from"
        print(
            f"measured order {verdict} the predicted one: {same} of {len(pairs)} pairs in the "
            "same order"
        )
    return result


def extra_overrides(overrides: dict, n: int, profile) -> dict:
    """The command line's own overrides, plus num_devices when planning for fewer devices."""
    extra = dict(overrides)
    if n < profile.num_devices:
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
    from jaxpar.plan.candidates import SPLITS

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
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        raise ConfigError(f"--batches {args.batches!r}: comma-separated integers") from None
    if any(b < 1 for b in batches):
        raise ConfigError(f"--batches {args.batches!r}: each batch must be >= 1")
    reference = None
    if args.from_run:  # before any compile: a bad reference is one line at once
        from jaxpar.plan import steps as steps_lib

        reference = steps_lib.load(args.from_run, args.target_accuracy)
    names = [a.strip() for a in args.axes.split(",") if a.strip()] or None
    from jaxpar import axes as axes_lib

    for a in names or ():
        if not axes_lib.registered(a):
            raise ConfigError(f"--axes {a!r}: choose from {', '.join(axes_lib.names())}")
    # Before JAX starts its backends: enough simulated CPU devices for the profile.
    configfile.set_host_device_count(max(16, n_profile))
    configfile.cpu_only()
    config = _load_config(args.config, overrides)

    from jaxpar.plan.report import report
    from jaxpar.plan.search import plan, rank
    from jaxpar.predict import gputarget, load_profile

    profile = load_profile(args.profile)
    n = args.devices or profile.num_devices
    limit = args.memory_gib * 2**30 if args.memory_gib else profile.memory_bytes
    print(
        f"planning {args.config} ({config.model.name} width {config.model.width:g}, global "
        f"batch {config.global_batch_size}) on {profile.name}: {n} devices, "
        f"{limit / 2**30:.2f} GiB per device",
        flush=True,
    )
    print(f"  {gputarget.programs_line(profile.target)}", flush=True)
    result = plan(
        config,
        profile,
        n,
        args.all_sync,
        splits,
        args.expand,
        args.max_candidates,
        limit,
        axes=names,
    )
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
            reference = _calibrate(args.config, config, overrides, args.target_accuracy, out)
        to_target = _rank_to_target(
            args, config, profile, n, limit, names, splits, reference, batches, result
        )
    measured = None
    if args.measure and fitting:
        out = out or Path(tempfile.mkdtemp(prefix="jaxpar-plan-"))
        runnable = [r for r in fitting if r["num_devices"] <= config.host_device_count]
        top = runnable[: args.measure]
        measured = _measure(args, args.config, config, overrides, top, args.profile, profile, out)
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
                "rows": result.rows,
                "ranked": [r["name"] for r in fitting],
                "not_fitting": [r["name"] for r in too_big],
                "refused": [
                    {"candidate": c.as_dict(), "reason": why_not} for c, why_not in result.refused
                ],
                "recommendation": recommendation,
                "command": cmd,
                "measured": measured,
                **(to_target or {}),
            },
            default=str,
        )
        print(f"\nwrote {out / 'plan.json'}")
    return 0


def _calibrate(config_file: str, config, overrides: dict, accuracy: float, out: Path):
    """Train the config itself to the target on this machine (stopping there), and read the
    reference from that run: the path without --from-run."""
    from jaxpar import trainer
    from jaxpar.plan import steps as steps_lib

    workdir = out / "calibration"
    print(
        f"\nno --from-run: training {config_file} to accuracy {accuracy:g} on this machine "
        f"first ({workdir}; up to {config.num_train_steps} steps)",
        flush=True,
    )
    run = configfile.override(
        config.copy_and_resolve_references(),
        {
            "target_accuracy": accuracy,
            "stop_at_target": True,
            "eval_every_steps": config.eval_every_steps or max(1, config.num_train_steps // 20),
            "checkpoint_every_steps": 0,
        },
    )
    trainer.train_and_evaluate(run, str(workdir))
    return steps_lib.load(str(workdir), accuracy)


def _rank_to_target(args, config, profile, n, limit, names, splits, reference, batches, result):
    """The time-to-target ranking over the batches: printed, and returned for plan.json."""
    from jaxpar.plan import to_target
    from jaxpar.plan.search import plan

    batches = batches or to_target.default_batches(reference, config.global_batch_size)
    per_batch = max(8, args.max_candidates // len(batches))
    print(
        f"\ntime to accuracy {args.target_accuracy:g}, from {reference.source}: batch "
        f"{reference.batch_size} reached it in {reference.steps_to_target} steps, noise scale "
        f"{reference.noise_scale:,.0f} (learning-rate rule {reference.lr_rule}); predicted "
        f"steps S(B) = {reference.min_steps:,.1f} x (1 + {reference.noise_scale:,.0f} / B)",
        flush=True,
    )
    if caveat := reference.caveat():
        print(f"note: {caveat}")
    rows = []
    for b in batches:
        if b == config.global_batch_size:
            found = result
        else:
            at = configfile.override(config.copy_and_resolve_references(), {"global_batch_size": b})
            try:
                found = plan(
                    at, profile, n, args.all_sync, splits, args.expand, per_batch, limit, axes=names
                )
            except ValueError as e:
                print(f"batch {b}: {oneline.first_line(e)}")
                continue
        rows += to_target.rows_to_target(found.rows, b, reference, config, limit)
    ranked, fastest = to_target.rank(rows, config.global_batch_size)
    print("\n" + "\n".join(to_target.table(ranked, args.top)))
    print(to_target.verdict(ranked, fastest))
    skipped = {r["sync_mode"] for r in rows if r.get("skipped_reason")}
    if skipped:
        print(
            f"left out: {', '.join(sorted(skipped))} (no measured steps multiplier: "
            "jaxpar/plan/steps.py SYNC_STEP_FACTORS)"
        )
    return {
        "target_accuracy": args.target_accuracy,
        "reference": {k: v for k, v in vars(reference).items() if k != "noise_trace"},
        "to_target_rows": rows,
        "to_target_ranked": [r["name"] for r in ranked],
    }


INTERRUPTED = (
    "stopped; OUT/plan.json is written only when the plan is done (what --measure "
    "measured so far stays in OUT/measured)"
)

if __name__ == "__main__":
    oneline.run_main(main, INTERRUPTED)
