"""Several training runs in one multi-process job, for tests/test_multiprocess.py.

    python -m tests.multi_jobs JOBS.json --coordinator=HOST:PORT --num_processes=N --process_id=I

Each process starts, imports JAX and joins the others once (as jaxpar.train does), then runs
every job of JOBS.json in turn: a list of {"workdir": ..., "overrides": {...}}, each
tests.util.tiny_config(**overrides) trained by trainer.train_and_evaluate, the function
jaxpar.train calls. Compiled programs stay in memory from one job to the next, so schedules
that run the same stage programs (GPipe and 1F1B) compile them once. Process 0 prints
"job WORKDIR" before each job. The processes leave together after the last job
(cluster.finish). A job that raises ends the process at once with its traceback and one line
(cluster.lost, as jaxpar.train does): JAX's exit handler would wait for the other process, which
may be waiting for this one in a collective, and the test would see a hang instead of the error.
"""

from __future__ import annotations

import argparse
import json
import os
import traceback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs")
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--num_processes", type=int, required=True)
    parser.add_argument("--process_id", type=int, required=True)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # as jaxpar.train: no C++ log lines

    from jaxpar import cluster, configfile, log

    configfile.make_configs_importable()
    log.setup()  # as jaxpar.train: the run's lines on stdout, from process 0
    cluster.initialize(args.coordinator, args.num_processes, args.process_id)

    import jax

    from jaxpar import trainer
    from tests.util import tiny_config

    finish = cluster.finish
    cluster.finish = lambda *a, **k: None  # the processes leave once, after the last job
    with open(args.jobs) as f:
        jobs = json.load(f)
    for job in jobs:
        overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in job["overrides"].items()}
        if jax.process_index() == 0:
            print(f"job {job['workdir']}", flush=True)
        try:
            trainer.train_and_evaluate(tiny_config(**overrides), job["workdir"])
        except Exception as e:  # noqa: BLE001 - the traceback, then one line, then out
            traceback.print_exc()
            cluster.lost(f"job {job['workdir']} failed: {type(e).__name__}", 1)
    finish()


if __name__ == "__main__":
    main()
