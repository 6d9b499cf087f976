"""Turn per-repeat row records into the sweep's results: mean and standard error over repeats,
speedup and efficiency against each row's baseline, every row's keys, and results.csv
(table.py draws results.md). Pure functions over plain dicts (tested on known inputs)."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from jaxpar import axes
from jaxpar.metrics import INPUT_BOUND_WAIT_SHARE

# Keys every row carries (None where a figure does not apply or the row failed).
KEYS = (
    "name",
    "group",
    "scaling",
    "status",
    "error",
    "mesh_shape",
    "mesh_axes",
    "num_devices",
    "strategy",
    "pipeline_schedule",
    "num_microbatches",
    "global_batch_size",
    "repeats",
    "images_per_sec",
    "images_per_sec_stderr",
    "images_per_sec_p10",
    "images_per_sec_p90",
    "speedup",
    "efficiency",
    "baseline",
    "step_time_median_s",
    "compile_time_s",
    "input_s_per_step",
    "input_wait_s_per_step",
    "input_wait_share",
    "loader_images_per_sec",
    "input_bound",
    "num_params",
    "param_bytes",
    "param_bytes_per_device",
    "opt_state_bytes_per_device",
    "state_bytes_per_device",
    "program_temp_bytes_per_device",
    "stored_activation_bytes_per_device",
    "memory_bytes_per_device",
    "collective_bytes_per_device",
    "collective_bytes_by_kind",
    "collective_bytes_by_axis",
    "data_allreduce_bytes",
    "data_allreduce_over_params",
    "ring_allreduce_wire_bytes",
    "halo_bytes_per_device",
    "bytes_between_stages",
    "stage_transfer_bytes_per_device",
    "analytic_bubble",
    "measured_bubble",
    "model_flops_per_image",
    "model_flops_per_sec",
    "mfu",
    "final_loss",
    "eval_accuracy",
    # the accuracy study (jaxpar.bench.accuracy): the setting a row repeats under another seed,
    # the published figure, and how the run generalised
    "label",
    "reference",
    "seed",
    "steps",
    "epochs",
    "seconds_per_epoch",
    "eval_loss",
    "train_eval_loss",
    "train_eval_accuracy",
    "generalization_gap",
    # a published efficiency for the row, and the row predicted on a hardware profile
    # (python -m jaxpar.bench --predict PROFILE)
    "reference_efficiency",
    "predicted_profile",
    "predicted_status",
    "predicted_failure",
    "predicted_images_per_sec",
    "predicted_step_time_s",
    "predicted_compute_s",
    "predicted_comm_s",
    "predicted_bubble_s",
    "predicted_overhead_s",
    "predicted_bubble",
    "predicted_memory_bytes_per_device",
    "predicted_fits",
    "predicted_speedup",
    "predicted_efficiency",
    # predicted against measured: predicted / measured - 1 (images/sec; memory per device)
    "predicted_error",
    "predicted_memory_error",
    # time to a target (suite time_to_target: jaxpar.bench.time_to_target), measured and
    # predicted by the steps model from the suite's reference row
    "steps_to_target",
    "time_to_target_s",
    "accuracy_at_target",
    "noise_scale_to_target",
    "sync_mode",
    "sync_setting",
    "predicted_steps_to_target",
    "predicted_steps_error",
    "predicted_steps_late",
    "predicted_time_to_target_s",
    "predicted_time_error",
)

_SPEC_KEYS = (
    "name",
    "group",
    "scaling",
    "baseline",
    "repeats",
    "label",
    "reference",
    "seed",
    "reference_efficiency",
)


def mean_stderr(values: list[float]) -> tuple[float | None, float | None]:
    """Mean, and standard error of the mean (None with fewer than two values)."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


def aggregate(spec: dict, repeats: list[dict]) -> dict[str, Any]:
    """One row from its suite entry and its repeat records (in repeat order)."""
    out: dict[str, Any] = dict.fromkeys(KEYS)
    out.update(name=spec["name"], group=spec.get("group", ""), scaling=spec.get("scaling"))
    out["baseline"] = spec.get("baseline") or None
    out["label"], out["reference"] = spec.get("label") or spec["name"], spec.get("reference")
    out["seed"] = spec.get("config", {}).get("seed")
    out["reference_efficiency"] = spec.get("reference_efficiency")
    out["repeats"] = len(repeats)
    failed = [r for r in repeats if r.get("status") != "ok"]
    first = repeats[0] if repeats else {}
    for key in KEYS:
        if key in first and key not in _SPEC_KEYS:
            out[key] = first[key]
    out["bytes_between_stages"] = first.get("bytes_between_stages_per_step")
    if out["mesh_shape"] is None and "mesh_shape" in spec.get("config", {}):
        out["mesh_shape"] = list(spec["config"]["mesh_shape"])  # a failed row: as asked
        out["mesh_axes"] = list(spec["config"].get("mesh_axes") or axes.DEFAULT)
        out["num_devices"] = math.prod(out["mesh_shape"]) if -1 not in out["mesh_shape"] else None
    if out["global_batch_size"] is None:  # a failed row: as asked
        out["global_batch_size"] = spec.get("config", {}).get("global_batch_size")
    if failed or not repeats:
        out["status"] = "failed"
        out["error"] = failed[0].get("error") if failed else "not run"
        return out
    out["status"], out["error"] = "ok", None
    rates = [r["images_per_sec"] for r in repeats if r.get("images_per_sec")]
    out["images_per_sec"], out["images_per_sec_stderr"] = mean_stderr(rates)
    batch = first["global_batch_size"]
    slow = [batch / r["step_time_p90_s"] for r in repeats if r.get("step_time_p90_s")]
    fast = [batch / r["step_time_p10_s"] for r in repeats if r.get("step_time_p10_s")]
    out["images_per_sec_p10"], _ = mean_stderr(slow)
    out["images_per_sec_p90"], _ = mean_stderr(fast)
    out["step_time_median_s"], _ = mean_stderr([r["step_time_median_s"] for r in repeats])
    out.update(_input(repeats, batch))
    shape = dict(zip(out["mesh_axes"] or axes.DEFAULT, out["mesh_shape"] or [1, 1, 1]))
    used = [a for a, n in shape.items() if n > 1]
    # replicas of the whole model over one batch axis, nothing else split (node x data's
    # gradient mean is three collectives, fsdp's is reduce-scatters: not one all-reduce)
    data_only = (
        len(used) == 1
        and axes.registered(used[0])
        and (axes.get(used[0]).role == "batch" and not axes.get(used[0]).shards_params)
    )
    if data_only and out["param_bytes"]:  # the gradient all-reduce against the parameters
        out["data_allreduce_over_params"] = out["data_allreduce_bytes"] / out["param_bytes"]
    if out["images_per_sec"] and out["model_flops_per_image"]:
        out["model_flops_per_sec"] = out["images_per_sec"] * out["model_flops_per_image"]
    return out


def _input(repeats: list[dict], batch: int) -> dict[str, Any]:
    """The input pipeline's figures over repeats: mean host batch time, wait and wait share;
    the loader's capacity from the mean host time; input-bound by the mean share (the rule of
    jaxpar.metrics.input_pipeline). Empty for records made before they were measured."""
    if not all(r.get("input_s_per_step") for r in repeats):
        return {}
    keys = ("input_s_per_step", "input_wait_s_per_step", "input_wait_share")
    out = {k: mean_stderr([r[k] for r in repeats])[0] for k in keys}
    out["loader_images_per_sec"] = batch / out["input_s_per_step"]
    out["input_bound"] = out["input_wait_share"] > INPUT_BOUND_WAIT_SHARE
    return out


def add_scaling(rows: list[dict]) -> list[dict]:
    """Speedup = images/sec over the baseline's; efficiency = speedup / devices.

    The baseline is the row named by `baseline`, else the first 1-device row of the same
    scaling kind; rows with scaling "none" get neither. Strong scaling (same global batch):
    efficiency is the usual speedup / N. Weak scaling (same batch per device): it is the
    per-device throughput ratio.
    """
    by_name = {r["name"]: r for r in rows}
    for r in rows:
        base = None
        if r["scaling"] == "none":  # not a throughput study (e.g. accuracy against batch)
            continue
        if r["baseline"]:
            base = by_name.get(r["baseline"])
        else:
            ones = [b for b in rows if b["num_devices"] == 1 and b["scaling"] == r["scaling"]]
            base = ones[0] if ones else None
            r["baseline"] = base["name"] if base else None
        ok = base and base["status"] == "ok" and base["images_per_sec"]
        if r["status"] == "ok" and ok and r["images_per_sec"]:
            r["speedup"] = r["images_per_sec"] / base["images_per_sec"]
            r["efficiency"] = r["speedup"] / r["num_devices"] * base["num_devices"]
    return rows


def to_csv(rows: list[dict]) -> str:
    """One line per row, every key; breakdowns as JSON in their cell."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(KEYS), extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow(
            {k: json.dumps(v) if isinstance(v, (dict, list, tuple)) else v for k, v in r.items()}
        )
    return buf.getvalue()
