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

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class MeasuredFactor:
    """One approximate mode's paired run to the target against allreduce's (plan
    --calibrate-sync): its steps, or, not reached in the run's steps, at least how many
    times allreduce's it needs."""

    mode: str
    setting: int
    steps_to_target: int | None
    allreduce_steps_to_target: int
    factor: float | None  # steps over allreduce's; None: not reached
    at_least: float | None  # not reached: the run's steps over allreduce's

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of_record(cls, record: Mapping[str, Any]) -> MeasuredFactor:
        return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class MeasuredFactors:
    """sync_factors.json beside a reference: the paired runs' setting and each mode's
    factor."""

    global_batch_size: int
    seed: int
    target_accuracy: float
    factors: tuple[MeasuredFactor, ...]

    def as_record(self) -> dict[str, Any]:
        return {
            "global_batch_size": self.global_batch_size,
            "seed": self.seed,
            "target_accuracy": self.target_accuracy,
            "factors": [f.as_record() for f in self.factors],
        }

    @classmethod
    def of_record(cls, record: Mapping[str, Any]) -> MeasuredFactors:
        return cls(
            global_batch_size=record["global_batch_size"],
            seed=record["seed"],
            target_accuracy=record["target_accuracy"],
            factors=tuple(MeasuredFactor.of_record(f) for f in record.get("factors", ())),
        )

    def reached(self) -> dict[tuple[str, int], float]:
        """(mode, setting) -> factor, for the modes that reached the target."""
        return {(f.mode, int(f.setting)): float(f.factor) for f in self.factors if f.factor}
