"""Steps to a target at any global batch, from one reference run (McCandlish et al. 2018).

The exact partitionings compute the same function, so at one global batch they need the same
steps; across batch sizes the empirical model of large-batch training says

    S(B) = S_min (1 + B_noise / B)        E(B) = B S(B) = E_min (1 + B / B_noise)

where B_noise is the gradient noise scale (measured by every jaxpar run: noise_scale.py) and
S_min = S(B0) / (1 + B_noise / B0) follows from the reference run's steps S(B0) at batch B0.
The model assumes the learning rate at each batch is (near) the best for it: the rule it is
stated with is the paper's eps(B) = eps_max / (1 + B_noise / B) (`lr_rule="noise"`, a config
a user runs with --config.lr_noise_scale=B_noise); linear scaling with warmup
(`lr_rule="linear"`) follows it while B << B_noise. A run at one fixed rate for every batch
(`"none"`) is outside the model: its prediction says so.

B_noise grows as training proceeds (Pollux's traces: ~70 to ~39k on CIFAR-10). The prediction
uses the reference run's average up to its target (the ratio of the two estimates' means over
those steps), the figure that describes the steps being counted.

The approximate sync modes change the steps a batch needs: `SYNC_STEP_FACTORS` holds the
multipliers measured from paired runs (the bench's time_to_target suite, docs/results.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from jaxpar import metrics as metrics_lib
from jaxpar.errors import ConfigError

LR_RULES = ("noise", "linear", "none")
# Steps of noise-scale figures a reference needs: the estimates are smoothed over about 20
# steps (noise_scale_decay 0.95), and an average over fewer is mostly one step's noise.
MIN_NOISE_STEPS = 20

# Steps to the target of an approximate sync mode over allreduce's at the same global batch
# (keys: (mode, setting): local_sgd by its period, async by its largest staleness), measured
# as the ratio of the steps summed over seeds 0-2 (docs/time_to_target.md, "Sync modes"):
# lenet 0.375 without BatchNorm on digits, 8 data replicas at batch 64, SGD momentum 0.9,
# constant lr 0.05, to test accuracy 0.9 (2,000 test images every 5 steps), with
#   python -m jaxpar.train --config configs/base.py --config.model.name=lenet
#     --config.model.width=0.375 --config.model.batch_norm=False --config.data.name=digits
#     --config.data.num_eval=2000 --config.target_accuracy=0.9 --config.stop_at_target=True
#     --config.eval_every_steps=5 --config.eval_batch_size=1000 --config.learning_rate=0.05
#     --config.lr_schedule=constant --config.warmup_steps=0 --config.lr_base_batch_size=64
#     --config.lr_noise_scale=39.4 --config.checkpoint_every_steps=0 --config.global_batch_size=64
#     --config.seed=S --config.sync.mode=MODE --config.sync.period=P (--config.sync.max_staleness=K)
# against the same command under allreduce (100-125 steps, 340 over the 3 seeds). Seed to seed
# the ratio spreads: local_sgd 2 0.84-1.09, 4 1.12-1.20, 8 1.57-1.64; async 1 1.55-3.09.
# async 2 is a lower bound: seeds 1 and 2 reached the target (3.85, 2.36), seed 0 never did in
# 2,000 steps. async 4 is left out: no seed reached it in 800 steps (more than 7x). Staleness
# hurts with momentum 0.9 at this rate far more than it would at a smaller one (docs/results.md,
# "Synchronisation modes"), so the async figures do not transfer to other rates. Transfer,
# measured: at batch 256 local_sgd 4 was 0.91 and async 1 2.13; with LeNet + Adam on shapes10
# at batch 64, local_sgd 4 above 2.3 (never reached in 1,000 steps) and async 1 1.36.
SYNC_STEP_FACTORS: dict[tuple[str, int], float] = {
    ("local_sgd", 2): 0.97,
    ("local_sgd", 4): 1.15,
    ("local_sgd", 8): 1.60,
    ("async", 1): 2.18,
    ("async", 2): 3.02,
}


def sync_factor(mode: str, setting: int = 0) -> float | None:
    """The steps multiplier of a sync mode (1 for the exact ones), or None where none was
    measured for this setting."""
    if mode in ("allreduce", "parameter_server", "sharded"):
        return 1.0
    return SYNC_STEP_FACTORS.get((mode, int(setting)))


@dataclasses.dataclass(frozen=True)
class Reference:
    """One measured run to a target: what the steps model starts from."""

    batch_size: int  # B0, the reference run's global batch
    steps_to_target: int  # S(B0)
    noise_scale: float  # B_noise: the run's average up to the target
    lr_rule: str  # how its learning rate would change with the batch (LR_RULES)
    target: str = ""  # what it reached, in words
    source: str = ""  # the workdir or file it was read from
    noise_trace: tuple[tuple[int, float], ...] = ()  # (step, B_simple) over the run
    learning_rate: float | None = None  # its peak rate, at batch_size
    target_accuracy: float | None = None  # the accuracy target it reached, if one

    @property
    def min_steps(self) -> float:
        """S_min: the steps at an infinite batch."""
        return self.steps_to_target / (1 + self.noise_scale / self.batch_size)

    @property
    def min_examples(self) -> float:
        """E_min: the examples at a batch of one."""
        return self.steps_to_target * self.batch_size / (1 + self.batch_size / self.noise_scale)

    def steps(self, batch: float) -> float:
        """Predicted steps to the target at global batch `batch`: S_min (1 + B_noise / B)."""
        return steps_at(batch, self.min_steps, self.noise_scale)

    def examples(self, batch: float) -> float:
        return batch * self.steps(batch)

    def learning_rate_at(self, batch: float) -> float | None:
        """The rate the prediction assumes at `batch`, by the reference's rule."""
        from jaxpar.optim import batch_scaled_rate

        if self.learning_rate is None:
            return None
        return batch_scaled_rate(
            self.lr_rule, self.learning_rate, self.batch_size, batch, self.noise_scale
        )

    def caveat(self) -> str | None:
        """Why the prediction may not hold for this reference, in one line, or None."""
        if self.lr_rule == "none":
            return (
                "the reference kept one learning rate for every batch (lr_rule none); the "
                "steps model assumes the rate follows the batch (--config.lr_noise_scale)"
            )
        return None


def steps_at(batch: float, min_steps: float, noise_scale: float) -> float:
    """S(B) = S_min (1 + B_noise / B)."""
    return min_steps * (1 + noise_scale / batch)


def fit_min_steps(batch: float, steps: float, noise_scale: float) -> float:
    """S_min from one measured (batch, steps) pair and B_noise."""
    return steps / (1 + noise_scale / batch)


def load(path: str, target_accuracy: float | None = None) -> Reference:
    """A reference from a run's workdir (its metrics.jsonl summary and noise lines) or from a
    JSON file of the same figures measured elsewhere (docs/time_to_target.md)."""
    if os.path.isdir(path):
        return from_workdir(path, target_accuracy)
    if os.path.isfile(path):
        return from_json(path, target_accuracy)
    raise ConfigError(f"--from-run {path!r}: no such workdir or JSON file")


def from_workdir(workdir: str, target_accuracy: float | None = None) -> Reference:
    summary = metrics_lib.last_summary(workdir)
    if summary is None:
        raise ConfigError(
            f"--from-run {workdir}: no finished run there (metrics.jsonl has no "
            "summary); train it to its end first"
        )
    if "noise_scale" not in summary:
        raise ConfigError(
            f"--from-run {workdir}: the run measured no gradient noise scale; "
            "rerun it with data replicas or --config.grad_accum_steps=2 under "
            "sync.mode=allreduce"
        )
    steps = summary.get("steps_to_target")
    if steps is None:
        aim = summary.get("target") or "no target was set"
        raise ConfigError(
            f"--from-run {workdir}: the run never reached its target ({aim}); "
            "nothing to extrapolate from: train to a target it reaches "
            "(--config.target_accuracy)"
        )
    measured = summary.get("noise_scale_steps", 0)
    if measured and measured < MIN_NOISE_STEPS:
        raise ConfigError(
            f"--from-run {workdir}: the noise scale was measured over {measured} "
            f"steps; at least {MIN_NOISE_STEPS} are needed for its average to say "
            "anything (train longer, or to a later target)"
        )
    if target_accuracy and abs(summary.get("target_accuracy", -1) - target_accuracy) > 1e-9:
        raise ConfigError(
            f"--from-run {workdir} reached {summary.get('target')!r}, not accuracy "
            f"{target_accuracy:g}; rerun it with --config.target_accuracy="
            f"{target_accuracy:g}"
        )
    trace = tuple(
        (r["step"], r["noise_scale"])
        for r in metrics_lib.records(workdir, "noise")
        if r.get("noise_scale") is not None and math.isfinite(r["noise_scale"])
    )
    return _checked(
        Reference(
            batch_size=int(summary["global_batch_size"]),
            steps_to_target=int(steps),
            noise_scale=_average(summary),
            lr_rule=summary.get("lr_rule", "none"),
            target=summary.get("target", ""),
            source=workdir,
            noise_trace=trace,
            learning_rate=summary.get("peak_learning_rate"),
            target_accuracy=summary.get("target_accuracy"),
        ),
        workdir,
    )


def _average(summary: dict) -> float:
    """The run's B_noise up to its target (its whole average where that is missing)."""
    for key in ("noise_scale_to_target", "noise_scale"):
        if summary.get(key) is not None:
            return float(summary[key])
    return math.nan


def from_json(path: str, target_accuracy: float | None = None) -> Reference:
    """The JSON form (docs/time_to_target.md): batch_size, steps_to_target, lr_rule, and the
    noise scale as noise_scale (one figure) or noise_trace ([[step, B_simple], ...], averaged
    up to the target)."""
    try:
        with open(path, encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--from-run {path}: not a readable JSON file ({e})") from None
    missing = [k for k in ("batch_size", "steps_to_target", "lr_rule") if k not in data]
    if "noise_scale" not in data and "noise_trace" not in data:
        missing.append("noise_scale or noise_trace")
    if missing:
        raise ConfigError(
            f"--from-run {path}: missing {', '.join(missing)} "
            "(docs/time_to_target.md lists the fields)"
        )
    trace = tuple((int(s), float(b)) for s, b in data.get("noise_trace", ()))
    steps = int(data["steps_to_target"])
    noise = data.get("noise_scale")
    if noise is None:
        upto = [b for s, b in trace if s <= steps and math.isfinite(b)]
        noise = sum(upto) / len(upto) if upto else math.nan
    if (
        target_accuracy
        and abs(float(data.get("target_accuracy", target_accuracy)) - target_accuracy) > 1e-9
    ):
        raise ConfigError(
            f"--from-run {path} reached accuracy {data['target_accuracy']}, not {target_accuracy:g}"
        )
    return _checked(
        Reference(
            batch_size=int(data["batch_size"]),
            steps_to_target=steps,
            noise_scale=float(noise),
            lr_rule=str(data["lr_rule"]),
            target=str(data.get("target", "")),
            source=path,
            noise_trace=trace,
            learning_rate=data.get("learning_rate"),
            target_accuracy=data.get("target_accuracy"),
        ),
        path,
    )


def _checked(ref: Reference, where: str) -> Reference:
    if ref.lr_rule not in LR_RULES:
        raise ConfigError(
            f"--from-run {where}: lr_rule {ref.lr_rule!r}; choose from {', '.join(LR_RULES)}"
        )
    if not (math.isfinite(ref.noise_scale) and ref.noise_scale > 0):
        raise ConfigError(
            f"--from-run {where}: its noise scale ({ref.noise_scale}) is not a "
            "positive number: the run was too short for the estimate to settle; "
            "train longer (a few hundred steps) before planning from it"
        )
    if ref.batch_size < 1 or ref.steps_to_target < 1:
        raise ConfigError(f"--from-run {where}: batch_size and steps_to_target must be >= 1")
    return ref
