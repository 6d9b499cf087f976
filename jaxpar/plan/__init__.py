"""Choose a partitioning: enumerate every mesh of a profile's devices over the registered axes
(data, fsdp, stage, tensor, and node on a profile of several nodes; jaxpar/axes/) and the
settings the trainer runs on it, predict each on the profile (jaxpar.predict), rank them.

    from jaxpar.plan import enumerate_candidates, plan, rank
    valid, refused = enumerate_candidates(config, 8)          # pure: no compile
    result = plan(config, profile)                            # two rounds of predictions
    fitting, too_big = rank(result.rows, memory_bytes=8 * 2**30)

The enumeration and the refusals are pure functions of the config (jaxpar.parallel.validate
decides what runs); predicting compiles every candidate's programs with abstract inputs, so the
search is bounded: round 1 predicts one default setting per mesh, round 2 expands the pipeline
settings (schedule, micro-batches, recomputation, virtual stages), the synchronisation mode
and the split of the best few meshes, round 3 combines the best of each. CLI:
`python -m jaxpar.plan --config FILE --profile configs/hardware/X.py`.
"""

from jaxpar.plan.candidates import (
    APPROX_SYNC,
    BASELINE,
    DEFAULT_AXES,
    EXACT_SYNC,
    SCHEDULES,
    SPLITS,
    VIRTUAL_STAGES,
    Candidate,
    check,
    default_of,
    enumerate_candidates,
    factorisations,
    meshes,
    microbatch_counts,
    space,
)
from jaxpar.plan.predictions import predict_is_default
from jaxpar.plan.reasons import command, unpriced, why
from jaxpar.plan.records import PlanRow
from jaxpar.plan.refusals import commonest
from jaxpar.plan.search import Plan, plan, rank

__all__ = [
    "APPROX_SYNC",
    "BASELINE",
    "DEFAULT_AXES",
    "EXACT_SYNC",
    "SCHEDULES",
    "SPLITS",
    "VIRTUAL_STAGES",
    "Candidate",
    "Plan",
    "PlanRow",
    "check",
    "command",
    "commonest",
    "default_of",
    "enumerate_candidates",
    "factorisations",
    "meshes",
    "microbatch_counts",
    "plan",
    "predict_is_default",
    "rank",
    "space",
    "unpriced",
    "why",
]
