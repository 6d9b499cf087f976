"""Entry point: python -m jaxpar.train --config FILE [--workdir DIR] [--config.KEY=VALUE ...]

Parses flags, sets up simulated CPU devices, and calls trainer.train_and_evaluate. Every error
a user can cause (bad configuration or flag, missing data, an unusable workdir, a diverged run)
ends with one line saying what is wrong and how to fix it, exit status 2 for bad input and 1
for a run that had to stop. JAXPAR_DEBUG=1 shows the full traceback instead.
"""

from __future__ import annotations

import os
import re
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from jaxpar import cluster, compile_cache, configfile, log, oneline
from jaxpar.errors import TrainingError
from jaxpar.jax_internals import JaxInternalsError
from jaxpar.run_spec import DEFAULTS

configfile.make_configs_importable()  # `from configs import base` from any directory

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
    "coordinator",
    None,
    "host:port of process 0 for a multi-process run (jax.distributed), or 'auto' to let JAX "
    "read the cluster from the environment (SLURM's srun and Open MPI's mpirun are detected "
    "without it).",
)
_BIND = flags.DEFINE_string(
    "coordinator_bind_address",
    None,
    "Multi-process runs: HOST:PORT where process 0's coordination service listens, normally "
    "with the coordinator's port (e.g. one interface's address, 10.0.0.1:12345). Default: the "
    "--coordinator address itself when it is a loopback one (127.0.0.1, localhost, ::1), so a "
    "run on one machine listens on loopback only; otherwise JAX's default, every interface "
    "([::]:PORT), or JAX_COORDINATOR_BIND_ADDRESS if set.",
)
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout",
    15,
    "Multi-process runs: seconds without heartbeats after which a process counts as lost and "
    "every other process stops with one line.",
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 1, "Processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", 0, "This process's index, 0..num_processes-1.")
_EVAL_ONLY = flags.DEFINE_bool(
    "eval_only", False, "Evaluate the newest checkpoint in --workdir; train and write nothing."
)
flags.mark_flags_as_required(["config"])

DEBUG = bool(os.environ.get("JAXPAR_DEBUG"))
_HINT = "(JAXPAR_DEBUG=1 shows the traceback)"


def fail(message: str, status: int) -> None:
    """Print one line on stderr and exit. In a multi-process run, exit at once: JAX's exit
    handler would wait for the other processes, which may be waiting for this one."""
    if cluster.is_multiprocess():
        cluster.lost(message, status)
    oneline.print_error(message)
    sys.exit(status)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, with config-file and override errors as one line (exit 2)."""
    try:
        return flags.FLAGS(argv)
    except Exception as e:  # every parse error becomes one line
        if DEBUG:
            raise
        text = oneline.joined(e)
        missing = re.search(r"No such file or directory: '([^']+)'", str(e))
        if missing:
            text = f"config file {missing.group(1)} does not exist; check the --config path"
        elif isinstance(e, AttributeError) and "has no attribute 'get_config'" in text:
            given = [
                b.split("=", 1)[1] if "=" in b else c
                for b, c in zip(argv, [*argv[1:], "?"])
                if b.split("=")[0] == "--config"
            ]
            path = given[-1] if given else "?"
            text = f"--config {path} has no get_config(): not an experiment config file"
        elif isinstance(e, AttributeError) and "Did you mean" in text:
            key = text.split(";")[0].strip("'\" ")
            text = f"unknown config key {key!r}: {text.split(';', 1)[1].strip()}"
        elif isinstance(e, AttributeError):
            text = f"unknown config key {text}; see configs/base.py for every key"
        fail(f"{text} {_HINT if not isinstance(e, flags.Error) else ''}".strip(), 2)
        raise  # unreachable


def default_workdir(config_path: str) -> str:
    name = os.path.splitext(os.path.basename(config_path))[0]
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    log.setup()  # the run's lines on stdout, from process 0 (jaxpar/log.py)
    # Orbax logs through absl, including tracebacks of failed background saves that jaxpar
    # reports as one line; JAXPAR_DEBUG=1 shows them (and absl's warnings).
    logging.set_verbosity(logging.WARNING if DEBUG else logging.FATAL)
    config = _loaded_config()
    configfile.set_host_device_count(config.host_device_count)  # unless XLA_FLAGS already says
    if not DEBUG:  # XLA's C++ log lines (e.g. the coordination service's) only on request
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # JAX is imported only now, after XLA_FLAGS is set.
    _join_cluster()
    compile_cache.enable(
        config.get("compile_cache", DEFAULTS.compile_cache)
    )  # --explain too uses it
    _run(config)


def _loaded_config():
    """--config's ConfigDict; a missing file is one line (exit 2)."""
    try:
        config = _CONFIG.value
        _ = config.host_device_count  # a file that failed to load raises here
    except OSError as e:
        missing = re.search(r"No such file or directory: '([^']+)'", str(e))
        if DEBUG or not missing:
            raise
        fail(f"config file {missing.group(1)} does not exist; check the --config path", 2)
    return config


def _join_cluster() -> None:
    """jax.distributed for a multi-process run (cluster.initialize); refusals in one line."""
    if _NUM_PROCESSES.value > 1 and not _COORDINATOR.value:
        raise app.UsageError("--num_processes > 1 needs --coordinator host:port of process 0")
    if not 0 <= _PROCESS_ID.value < max(_NUM_PROCESSES.value, 1):
        raise app.UsageError(f"--process_id must be in [0, {_NUM_PROCESSES.value})")
    try:
        cluster.initialize(
            _COORDINATOR.value,
            _NUM_PROCESSES.value,
            _PROCESS_ID.value,
            _HEARTBEAT.value,
            bind=_BIND.value,
        )
    except cluster.ClusterError as e:
        fail(str(e), 2)
    except JaxInternalsError as e:
        fail(str(e), 1)


def _run(config) -> None:
    """--explain, or train (and evaluate) into the workdir; every error as one line."""
    # These import JAX, which fixes the device count: only after main() has set XLA_FLAGS.
    from jaxpar import config as config_lib
    from jaxpar import data, explain, trainer

    try:
        if _EXPLAIN.value:
            print(explain.explain(config))
            return
        workdir = _WORKDIR.value
        if not workdir:
            workdir = default_workdir(flags.FLAGS["config"].config_filename)
            print(f"workdir: {workdir} (choose one with --workdir)")
        trainer.train_and_evaluate(
            config, workdir, eval_only=_EVAL_ONLY.value, profile=_PROFILE.value
        )
    except (config_lib.ConfigError, data.DataError) as e:
        fail(str(e), 2)
    except TrainingError as e:
        fail(str(e), 1)
    except KeyboardInterrupt:
        fail("interrupted: stopped at once; checkpoints already saved are kept", 130)
    except Exception as e:  # anything else: one line, the traceback on request
        if DEBUG:
            raise
        cluster.settle(e)  # a lost process: the watchdog names it (and exits)
        fail(f"{type(e).__name__}: {oneline.joined(e)} {_HINT}", 1)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
