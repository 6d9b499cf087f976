"""One row, in its own process: train the row's config and write its summary as JSON.

Run by the sweep as `python -m jaxpar.bench --_row NAME ...`. A refused config, missing data
or any exception becomes `status: failed` with a one-line error; a crash or out-of-memory kill
leaves no file, and the sweep records the exit status instead.
"""

from __future__ import annotations

import os
import platform
import traceback
from typing import Any

from jaxpar import configfile, oneline, peak_flops
from jaxpar.bench.records import Machine
from jaxpar.files import write_json


def run_row(config, workdir: str, result_path: str, profile: bool = False) -> None:
    """Train `config` and write the summary (plus the machine) to `result_path`. MFU is
    reported where jaxpar.peak_flops knows the device's peak."""
    configfile.set_host_device_count(config.host_device_count)
    import jax  # only now, and what imports it: XLA_FLAGS must be set first

    from jaxpar import config as config_lib
    from jaxpar import data, trainer

    record: dict[str, Any] = {"status": "failed", "error": None}
    try:
        result = trainer.train_and_evaluate(config, workdir, profile=profile)
        summary = result.summary
        record.update(summary.as_record())
        if result.finished:
            record["finished"] = True
        record["status"] = "ok"
        kind = jax.devices()[0].device_kind
        peak = peak_flops.of_device(kind, config.model.dtype)
        timed = summary.throughput
        flops = (timed.images_per_sec if timed else 0.0) * summary.model_flops_per_image
        record["model_flops_per_sec"] = flops
        record["peak_flops_per_device"] = peak
        record["mfu"] = flops / (peak * summary.num_devices) if peak else None
    except (config_lib.ConfigError, data.DataError) as e:
        record["error"] = oneline.first_line(e)
    except Exception as e:  # noqa: BLE001 - any failure is this row's result, not the sweep's
        traceback.print_exc()
        record["error"] = f"{type(e).__name__}: {oneline.first_line(e)}".strip()
    record["machine"] = Machine(
        jax=jax.__version__,
        backend=jax.default_backend(),
        device_kind=jax.devices()[0].device_kind,
        devices_present=jax.device_count(),
        cpu_cores=os.cpu_count(),
        processor=platform.processor() or platform.machine(),
    ).as_record()
    if profile and record["status"] == "ok":
        record["profile_dir"] = os.path.join(workdir, "profile")
    write_json(result_path, record)
