"""Calibrate a hardware profile from single-device measurements, and report how well the
calibration carries to the runs it was not fitted to.

    python -m jaxpar.predict --calibrate SOURCE [SOURCE ...] --profile BASE [--fit a,b] [--pool]

A SOURCE is a bench sweep (`python -m jaxpar.bench --out OUT`), whose measured 1-device rows
are the runs, or a config file listing published runs (configs/predict/dgx1_single_gpu.py).
A profile file lists the runs it is fitted to itself (`calibration_runs`, with `fit`). Only
single-device figures are fitted, so that every multi-device row stays a check.

`--pool` (simulated CPU devices only) measures `compute_pool`: how many times one device's
rate N simulated devices reach together when each runs its own copy of the 1-device step at
once (no collectives). It is a property of the machine's cores and of the program's size,
measured like a link's bandwidth, not fitted to any partitioning's figure. It also measures the
links (`cpulinks.measure_links`) and how a matrix kernel's rate falls with its narrowest
dimension (`micro.measure_narrow`: narrow_width, which the fit then prices with) and the
forward pass (`micro.measure_forward`: forward_speedup, from the fitted rates).
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

import jax

from jaxpar import analysis, configfile
from jaxpar import suites as suite_lib
from jaxpar.errors import ConfigError
from jaxpar.predict.calibrate import timer
from jaxpar.predict.kernels import opclass
from jaxpar.predict.profiles import fitting, hardware
from jaxpar.predict.profiles.calibration_runs import calibration_ops, run_config
from jaxpar.predict.programs import gputarget
from jaxpar.predict.programs.workload import input_spec, strategy_for
from jaxpar.predict.step import pricing

_RUN_KEYS = {
    "model.name": "model",
    "model.width": "width",
    "model.batch_norm": "batch_norm",
    "model.head": "head",
    "model.dtype": "dtype",
}


def run_of(config, images_per_sec: float) -> dict[str, Any]:
    """A calibration run (the dict profiles list) for a 1-device config and its measured rate."""
    image_shape, classes = input_spec(config)
    run = {short: config[key.split(".")[0]][key.split(".")[1]] for key, short in _RUN_KEYS.items()}
    return {
        **run,
        "image_shape": tuple(image_shape),
        "num_classes": int(classes),
        "batch_size": int(config.global_batch_size),
        "images_per_sec": float(images_per_sec),
    }


def runs_from(source: str) -> list[dict[str, Any]]:
    """Calibration runs from a bench sweep directory (its measured 1-device rows) or from a
    config file whose get_config() lists `runs` (published single-device figures)."""
    if os.path.isfile(source) and source.endswith(".py"):
        runs = [dict(r) for r in configfile.load(source).get("runs", ())]
        if not runs:
            raise ConfigError(f"{source!r} lists no `runs`")
        return runs
    return runs_from_sweep(source)


def runs_from_sweep(out: str) -> list[dict[str, Any]]:
    """The measured 1-device rows of a bench sweep directory as calibration runs."""

    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        raise ConfigError(f"no bench results in {out!r} (looked for {path})")
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    with open(os.path.join(out, "sweep.json"), encoding="utf-8") as f:
        sweep = json.load(f)
    spec = suite_lib.load_suite(os.path.join(suite_lib.ROOT, sweep["suite"]))
    entries = {r["name"]: r for r in spec.rows}
    runs = []
    for row in results["rows"]:
        if row["status"] != "ok" or row["num_devices"] != 1 or row["name"] not in entries:
            continue
        config = suite_lib.row_config(spec, entries[row["name"]], sweep.get("overrides", {}))
        runs.append({**run_of(config, row["images_per_sec"]), "name": row["name"]})
    if not runs:
        raise ConfigError(f"{out!r} has no measured 1-device row to calibrate on")
    return runs


def cross_check(profile: hardware.Profile, runs: list[dict], names: tuple[str, ...]) -> list[dict]:
    """Each model's runs predicted by a fit on the other models' runs only (where those are
    enough to fit `names`): how a calibration carries across models."""
    models = sorted({r["model"] for r in runs})
    out = []
    for model in models:
        others = [r for r in runs if r["model"] != model]
        if len(others) < len(names):
            continue
        fitted = fitting.fit(profile, others, names).profile
        for r in (r for r in runs if r["model"] == model):
            step = pricing.program_time(
                fitted, calibration_ops(r, gputarget.of(fitted)), r.get("dtype", "float32")
            )
            step += fitted.host.step_overhead_s + fitted.host.program_overhead_s
            out.append(
                {
                    **r,
                    "predicted_images_per_sec": r["batch_size"] / step,
                    "error": r["batch_size"] / step / r["images_per_sec"] - 1,
                    "fitted_on": sorted({o["model"] for o in others}),
                }
            )
    return out


def measure_pool(run: dict[str, Any], counts=(2, 4, 8), seconds: float = 2.0) -> list[dict]:
    """For each per-device batch run batch / N (N in counts) and each N: one simulated device
    alone running the run's 1-device step at that batch (images/sec), and N devices each
    running its own copy of it at once: their aggregate rate over the one device's
    (`speedup`), with the mean FLOPs of the program's matrix kernels (`kernel_flops`, the size
    the pool is looked up by). Copies are dispatched round-robin without waiting (JAX's async
    dispatch), at most 2 in flight per device."""

    if len(jax.devices()) < max(counts):
        raise ConfigError(f"--pool needs {max(counts)} devices, jax has {len(jax.devices())}")
    out = []
    for batch in sorted({run["batch_size"] // n for n in counts}, reverse=True):
        small = {**run, "batch_size": batch}
        programs = []
        for d in range(max(counts)):
            strategy = strategy_for(run_config(small), 1, [jax.devices()[d]])
            (p,) = analysis.programs(strategy, batch)
            programs.append([p.compiled, *jax.block_until_ready(analysis._materialize(p.args))])
        matmuls = opclass.classify(programs[0][0].as_text()).matmuls
        size = sum(m.flops for m in matmuls) / max(len(matmuls), 1)

        def rate(k: int, programs: list = programs) -> float:
            """Programs run per second by the first k devices, each its own copy, one call
            each a round, at most two rounds in flight; the better of two repeats."""

            def round_():
                metrics = []
                for entry in programs[:k]:
                    compiled, state, batch = entry
                    entry[1], out = compiled(state, batch)  # the state is donated: carry it
                    metrics.append(out)
                return metrics

            timed = timer.measure(round_, seconds / 2, repeats=2, min_calls=4, window=2)
            return k / timed.best

        alone = rate(1)
        for n in counts:
            together = rate(n)
            out.append(
                {
                    "n": n,
                    "batch_size": batch,
                    "kernel_flops": size,
                    "images_per_sec": alone * batch,
                    "speedup": together / alone,
                }
            )
    return out


def report(profile: hardware.Profile, runs: list[dict], names: tuple[str, ...]) -> str:
    """The fitted costs, each run's fit, and the cross-model check, as text."""
    result = fitting.fit(profile, runs, names)
    p = result.profile
    lines = [f"fitted {', '.join(names)} on {len(runs)} single-device run(s):"]
    for n in names:
        value = hardware.value(p, n)
        lines.append(f"  c.{n} = {value:.4g}")
    lines.append("")
    lines.append("| run | model | dtype | batch | measured img/s | fitted img/s | error |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in result.rows:
        lines.append(
            f"| {r.get('name', '')} | {r['model']} | {r.get('dtype', 'float32')} | "
            f"{r['batch_size']} | {r['images_per_sec']:,.1f} | "
            f"{r['fitted_images_per_sec']:,.1f} | {100 * r['error']:+.1f}% |"
        )
    cross = cross_check(profile, runs, names)
    if cross:
        lines += [
            "",
            "each model predicted from a fit on the other models only:",
            "",
            "| model | batch | fitted on | measured img/s | predicted | error |",
            "|---|---|---|---|---|---|",
        ]
        for r in cross:
            lines.append(
                f"| {r['model']} | {r['batch_size']} | {'+'.join(r['fitted_on'])} | "
                f"{r['images_per_sec']:,.1f} | {r['predicted_images_per_sec']:,.1f} | "
                f"{100 * r['error']:+.1f}% |"
            )
        errors = sorted(abs(r["error"]) for r in cross)
        lines.append(
            f"cross-model median |error| {100 * statistics.median(errors):.1f}% "
            f"over {len(errors)} run(s)"
        )
    lines.append("")
    lines.append("calibration_runs for the profile file:")
    keep = (
        "model",
        "width",
        "batch_norm",
        "head",
        "dtype",
        "image_shape",
        "num_classes",
        "batch_size",
        "images_per_sec",
    )
    for r in runs:
        lines.append("    " + repr({k: r[k] for k in keep if k in r}) + ",")
    return "\n".join(lines)


def pool_runs(run: dict[str, Any], pool: list[dict]) -> list[dict[str, Any]]:
    """The one-device measurements `measure_pool` made (one per batch), as calibration runs."""
    alone = {m["batch_size"]: m["images_per_sec"] for m in pool}
    return [
        {
            **run,
            "name": f"1 device, batch {batch} (pool)",
            "batch_size": batch,
            "images_per_sec": rate,
        }
        for batch, rate in alone.items()
    ]


def pool_report(run: dict[str, Any], pool: list[dict]) -> str:
    lines = [
        (
            f"compute pool ({run['model']} width {run.get('width', 1.0)}, N copies of the "
            f"1-device step at once, at batches {run['batch_size']} / N):"
        )
    ]
    for m in pool:
        lines.append(
            f"  batch {m['batch_size']} (matrix kernels of {m['kernel_flops'] / 1e6:.1f} "
            f"MFLOP on average; alone {m['images_per_sec']:,.1f} img/s): {m['n']} at "
            f"once {m['speedup']:.2f}x its rate"
        )
    points = tuple(
        (m["n"], float(f"{m['kernel_flops']:.3g}"), round(m["speedup"], 2)) for m in pool
    )
    lines.append(f"  c.compute_pool = {points!r}")
    return "\n".join(lines)
