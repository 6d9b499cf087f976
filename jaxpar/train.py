"""Entry point: python -m jaxpar.train --config FILE [--workdir DIR] [--config.KEY=VALUE ...]

Parses flags, sets up simulated CPU devices, and calls trainer.train_and_evaluate. Bad
configurations and missing data end with one line saying what is wrong and how to fix it.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

# configs/ lives beside the package: make `from configs import base` work from any directory.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file, e.g. configs/vgg19_hybrid.py.", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Where metrics and checkpoints go (default: runs/<config>-<time>)."
)
_EXPLAIN = flags.DEFINE_bool(
    "explain", False, "Print the mesh, layouts, memory and collectives of the step; no training."
)
_PROFILE = flags.DEFINE_bool(
    "profile", False, "Write a JAX profiler trace of 3 steps after warm-up to WORKDIR/profile."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator", None, "host:port of process 0 for a multi-process run (jax.distributed)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 1, "Processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", 0, "This process's index, 0..num_processes-1.")
flags.mark_flags_as_required(["config"])


def use_host_devices(count: int) -> None:
    """Simulate `count` CPU devices unless XLA_FLAGS already says; must run before JAX starts."""
    flag = "--xla_force_host_platform_device_count"
    current = os.environ.get("XLA_FLAGS", "")
    if flag not in current and count > 1:
        os.environ["XLA_FLAGS"] = f"{current} {flag}={count}".strip()


def init_distributed(coordinator: str | None, num_processes: int, process_id: int) -> None:
    """Join JAX's multi-process runtime (one call per process, before any computation).

    CPU devices of different processes talk through gloo collectives; GPUs use NCCL.
    """
    if num_processes <= 1:
        return
    if not coordinator:
        raise app.UsageError("--num_processes > 1 needs --coordinator host:port of process 0")
    if not 0 <= process_id < num_processes:
        raise app.UsageError(f"--process_id must be in [0, {num_processes}), got {process_id}")
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id)


def default_workdir(config_path: str) -> str:
    name = os.path.splitext(os.path.basename(config_path))[0]
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)  # keep JAX's INFO lines off the console
    config = _CONFIG.value
    use_host_devices(config.host_device_count)
    # JAX is imported only now, after XLA_FLAGS is set.
    init_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    from jaxpar import config as config_lib
    from jaxpar import data, trainer

    if _EXPLAIN.value:
        from jaxpar import explain

        try:
            print(explain.explain(config))
        except (config_lib.ConfigError, data.DataError) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        return
    workdir = _WORKDIR.value
    if not workdir:
        workdir = default_workdir(flags.FLAGS["config"].config_filename)
        print(f"workdir: {workdir} (choose one with --workdir)")
    try:
        trainer.train_and_evaluate(config, workdir, profile=_PROFILE.value)
    except (config_lib.ConfigError, data.DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    app.run(main)
