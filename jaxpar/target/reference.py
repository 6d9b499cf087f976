"""A reference run to a target, the record the steps model starts from: its batch, its steps
to the target, and its per-step noise trace (steps.py), with what it predicts at other
batches. reading.py reads one from a run's workdir or from a JSON file, both through one path.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jaxpar.gain import gain_at
from jaxpar.optim import batch_scaled_rate
from jaxpar.target import steps as steps_lib
from jaxpar.target.steps import TracePoint

LR_RULES = ("noise", "linear", "none", "adascale")


@dataclasses.dataclass(frozen=True)
class Reference:
    """One measured run to a target."""

    batch_size: int  # B0: its global batch
    steps_to_target: int  # S(B0)
    base_batch: int  # Bb: the batch its progress counts steps of (B0, or AdaScale's base)
    trace: tuple[TracePoint, ...]  # per step to the target: phi and the progress made
    noise_scale: float  # one B_noise for the whole run (the one-average model's)
    lr_rule: str  # how its rate would change with the batch (LR_RULES)
    target: str = ""  # what it reached, in words
    source: str = ""  # the workdir or file it was read from
    learning_rate: float | None = None  # its peak rate, at base_batch
    target_accuracy: float | None = None  # the accuracy target it reached, if one
    # (mode, setting) -> steps over allreduce's, measured on its model (reading.SYNC_FACTORS_FILE)
    sync_factors: dict[tuple[str, int], float] = dataclasses.field(default_factory=dict)

    @property
    def progress_to_target(self) -> float:
        """The progress (steps at the base batch) the reference made to its target."""
        return sum(p.progress for p in self.trace)

    def steps(self, batch: float) -> float:
        """Predicted steps to the target at global batch `batch`: along the noise trace."""
        return steps_lib.steps_along(self.trace, batch, self.base_batch)

    def steps_one_average(self, batch: float) -> float:
        """The same with one B_noise for the whole run (`noise_scale`)."""
        return steps_lib.steps_one_average(
            self.progress_to_target, self.noise_scale, batch, self.base_batch
        )

    @property
    def min_steps(self) -> float:
        """The one-average model's S_min: the steps at an infinite batch."""
        return self.progress_to_target / (1 + self.noise_scale / self.base_batch)

    def phases(self, parts: int = 5) -> list[tuple[int, int, float]]:
        """(first step, last step, mean B_simple) over `parts` equal spans of the trace: how
        the noise scale moved on the way to the target (infinite values left out)."""
        n = len(self.trace)
        out = []
        for i in range(parts):
            span = self.trace[i * n // parts : (i + 1) * n // parts]
            finite = [p.noise_scale for p in span if math.isfinite(p.noise_scale)]
            if span:
                mean = sum(finite) / len(finite) if finite else math.inf
                out.append((span[0].step, span[-1].step, mean))
        return out

    def learning_rate_at(self, batch: float) -> float | None:
        """The rate the prediction assumes at `batch`: AdaScale's at the base batch times the
        gain at the one average (`lr_rule` adascale), else the reference's rule."""
        if self.learning_rate is None:
            return None
        if self.lr_rule == "adascale":
            return self.learning_rate * gain_at(self.noise_scale, self.base_batch, batch)
        return batch_scaled_rate(
            self.lr_rule, self.learning_rate, self.batch_size, batch, self.noise_scale
        )

    def caveat(self) -> str | None:
        """Why the prediction may not hold for this reference, in one line, or None."""
        if self.lr_rule == "none":
            return (
                "the reference kept one learning rate for every batch (lr_rule none); the "
                "steps model assumes the rate follows the noise (--config.lr_adaptation="
                "adascale, or --config.lr_noise_scale)"
            )
        return None

    def describe(self) -> str:
        """The reference in one line."""
        first, last = self.phases(2)[0][2], self.phases(2)[-1][2]
        under = (
            f" under AdaScale (base batch {self.base_batch})" if self.lr_rule == "adascale" else ""
        )
        return (
            f"batch {self.batch_size} reached it in {self.steps_to_target} steps{under}, "
            f"progress {self.progress_to_target:,.0f}; B_simple {_noise(first)} over the first "
            f"half, {_noise(last)} over the second (one average {_noise(self.noise_scale)})"
        )

    def as_record(self) -> dict[str, Any]:
        """The reference as plan.json keeps it (without the per-step trace)."""
        return {
            "batch_size": self.batch_size,
            "steps_to_target": self.steps_to_target,
            "base_batch": self.base_batch,
            "progress_to_target": self.progress_to_target,
            "noise_scale": self.noise_scale,
            "lr_rule": self.lr_rule,
            "target": self.target,
            "source": self.source,
            "learning_rate": self.learning_rate,
            "target_accuracy": self.target_accuracy,
            "trace_steps": len(self.trace),
            "sync_factors": [[m, k, f] for (m, k), f in sorted(self.sync_factors.items())],
        }


def _noise(value: float) -> str:
    return "not settled" if not math.isfinite(value) else f"{value:,.0f}"
