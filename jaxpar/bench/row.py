"""One row, in its own process: train the row's config and write its summary as JSON.

Run by the sweep as `python -m jaxpar.bench --_row NAME ...`. A refused config, missing data
or any exception becomes `status: failed` with a one-line error; a crash or out-of-memory kill
leaves no file, and the sweep records the exit status instead.
"""

from __future__ import annotations

import json
import os
import platform
import traceback
from typing import Any

# Peak dense FLOP/s per device by device kind and compute dtype (float32 runs as TF32 on
# these GPUs under JAX's default matmul precision). MFU is reported only where known.
PEAK_FLOPS = {
    "NVIDIA H100 80GB HBM3": {"float32": 494.7e12, "bfloat16": 989.4e12},
    "NVIDIA H200": {"float32": 494.7e12, "bfloat16": 989.4e12},
    "NVIDIA A100-SXM4-80GB": {"float32": 156e12, "bfloat16": 312e12},
    "NVIDIA A100-SXM4-40GB": {"float32": 156e12, "bfloat16": 312e12},
}


def write_json(path: str, value: Any) -> None:
    """Write atomically: a reader (or a Ctrl-C) never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, default=_plain)
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


def run_row(config, workdir: str, result_path: str, profile: bool = False) -> None:
    """Train `config` and write the summary (plus the machine) to `result_path`."""
    flag = "--xla_force_host_platform_device_count"
    if flag not in os.environ.get("XLA_FLAGS", "") and config.host_device_count > 1:
        os.environ["XLA_FLAGS"] = (
            f"{os.environ.get('XLA_FLAGS', '')} {flag}={config.host_device_count}".strip()
        )
    import jax  # only now: XLA_FLAGS must be set first

    from jaxpar import config as config_lib
    from jaxpar import data, trainer

    record: dict[str, Any] = {"status": "failed", "error": None}
    try:
        summary = trainer.train_and_evaluate(config, workdir, profile=profile)
        summary.pop("state", None)
        record.update(summary)
        record["status"] = "ok"
        kind = jax.devices()[0].device_kind
        peak = PEAK_FLOPS.get(kind, {}).get(config.model.dtype)
        flops = summary.get("images_per_sec", 0.0) * summary["model_flops_per_image"]
        record["model_flops_per_sec"] = flops
        record["peak_flops_per_device"] = peak
        record["mfu"] = flops / (peak * summary["num_devices"]) if peak else None
    except (config_lib.ConfigError, data.DataError) as e:
        record["error"] = str(e).splitlines()[0]
    except Exception as e:  # noqa: BLE001 - any failure is this row's result, not the sweep's
        traceback.print_exc()
        record["error"] = one_line(e)
    record["machine"] = {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "devices_present": jax.device_count(),
        "cpu_cores": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    if profile and record["status"] == "ok":
        record["profile_dir"] = os.path.join(workdir, "profile")
    write_json(result_path, record)
