"""How many more steps to a target an approximate sync mode needs than allreduce at the same
global batch: multipliers measured from paired runs (`SYNC_STEP_FACTORS`), keyed by the mode's
setting (local SGD's period, async's largest staleness).

The exact modes (allreduce, parameter_server, sharded) compute the single-device function and
need the same steps. The multipliers were measured on one model at one rate and do not
transfer to another (docs/time_to_target.md, "Sync modes"): a prediction that uses them says
so, and a run of the user's own model measures its own (`python -m jaxpar.plan
--calibrate-sync`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxpar import run_spec

EXACT = ("allreduce", "parameter_server", "sharded")

# From the paired runs of docs/time_to_target.md, "Sync modes: the steps multipliers" (LeNet
# 0.375 on the digits, 8 replicas at batch 64, SGD with momentum 0.9 at lr 0.05, to accuracy
# 0.9, seeds 0-2): the steps summed over the seeds over allreduce's.
SYNC_STEP_FACTORS: dict[tuple[str, int], float] = {
    ("local_sgd", 2): 0.97,
    ("local_sgd", 4): 1.15,
    ("local_sgd", 8): 1.60,
    ("async", 1): 2.18,
    ("async", 2): 3.02,
}

# The config key each approximate mode's multiplier is keyed by.
SETTING_KEYS = run_spec.SYNC_SETTING_KEYS


def sync_setting(mode: str, config: Any) -> int:
    """The setting `mode`'s multiplier is keyed by, from a ConfigDict or a {dotted key: value}
    mapping of overrides (a key it lacks has configs/base.py's default); 0 for the others."""
    key = SETTING_KEYS.get(mode)
    return 0 if key is None else int(run_spec.setting(config, key))


def sync_factor(mode: str, setting: int = 0, measured: Mapping | None = None) -> float | None:
    """The steps multiplier of a sync mode: 1 for the exact ones, the `measured` one (keyed
    (mode, setting)) where given, else SYNC_STEP_FACTORS', else None."""
    if mode in EXACT:
        return 1.0
    key = (mode, int(setting))
    if measured and key in measured:
        return float(measured[key])
    return SYNC_STEP_FACTORS.get(key)
