"""The goal of a run: the first evaluation that reaches `target_accuracy` (and/or
`target_eval_loss`), and how many steps, examples and seconds of training it took.

The time is training wall time from the first step (the compile before it excluded) to the
end of the step evaluated, less the time spent off the clock (evaluations, checkpoint saves):
what the steps cost, whatever the evaluation granularity. The granularity itself bounds the
steps: the target is met somewhere in the `eval_every_steps` before the evaluation that sees
it, so steps_to_target is an upper bound by at most that many steps; the evaluations' own cost
is reported beside it (`eval_time_s`).
"""

from __future__ import annotations

import dataclasses
import logging
import math

from jaxpar.run_spec import TargetSpec
from jaxpar.summary_record import TargetFigures, TargetReached

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Target:
    """What a run aims at (0 or less: no aim on that figure) and when it got there."""

    accuracy: float = 0.0
    eval_loss: float = 0.0
    batch_size: int = 0
    reached_step: int | None = None
    reached_seconds: float | None = None
    reached: dict[str, float] = dataclasses.field(default_factory=dict)
    best_accuracy: float = -math.inf
    best_loss: float = math.inf

    @classmethod
    def of_spec(cls, target: TargetSpec, batch_size: int) -> Target:
        """The aim of a run's resolved target, for steps of `batch_size` images."""
        return cls(target.accuracy, target.eval_loss, batch_size)

    @property
    def wanted(self) -> bool:
        return self.accuracy > 0 or self.eval_loss > 0

    def describe(self) -> str:
        parts = []
        if self.accuracy > 0:
            parts.append(f"eval accuracy >= {self.accuracy:g}")
        if self.eval_loss > 0:
            parts.append(f"eval loss <= {self.eval_loss:g}")
        return " and ".join(parts)

    def meets(self, evaluation: dict[str, float]) -> bool:
        ok = True
        if self.accuracy > 0:
            ok = ok and evaluation["accuracy"] >= self.accuracy
        if self.eval_loss > 0:
            ok = ok and evaluation["loss"] <= self.eval_loss
        return ok

    def replay(self, evaluations: list[dict]) -> None:
        """Continue from a resumed run's evaluations (metrics.jsonl "eval" lines): a target met
        before the resume keeps its step; its time is unknown (the clock started again)."""
        for e in evaluations:
            self.check(e["step"], e, math.nan, quiet=True)

    def check(
        self, step: int, evaluation: dict[str, float], train_seconds: float, quiet: bool = False
    ) -> bool:
        """Record an evaluation after `step` steps and `train_seconds` of training; True the
        first time it meets the target."""
        self.best_accuracy = max(self.best_accuracy, evaluation["accuracy"])
        self.best_loss = min(self.best_loss, evaluation["loss"])
        if not self.wanted or self.reached_step is not None or not self.meets(evaluation):
            return False
        self.reached_step, self.reached_seconds = step, train_seconds
        self.reached = {"accuracy": evaluation["accuracy"], "loss": evaluation["loss"]}
        if quiet:
            return True
        logger.info(
            f"target reached at step {step} ({self.describe()}: accuracy "
            f"{evaluation['accuracy']:.4f}, loss {evaluation['loss']:.4f}) after "
            f"{train_seconds:.1f} s of training"
        )
        return True

    def summary(self, steps_run: int, eval_time_s: float, evals: int) -> TargetFigures | None:
        """The summary's target figures (None without a target); a target never reached says
        so in one line."""
        if not self.wanted:
            return None
        reached = None
        if self.reached_step is None:
            logger.info(
                f"target not reached in {steps_run} steps ({self.describe()}; best accuracy "
                f"{self.best_accuracy:.4f}, best loss {self.best_loss:.4f})"
            )
        else:
            reached = TargetReached(
                steps_to_target=self.reached_step,
                examples_to_target=self.reached_step * self.batch_size,
                # None where the target was met before a resume: that run's clock is gone
                time_to_target_s=None if math.isnan(self.reached_seconds) else self.reached_seconds,
                accuracy_at_target=self.reached["accuracy"],
                eval_loss_at_target=self.reached["loss"],
            )
        return TargetFigures(
            target=self.describe(),
            target_reached=self.reached_step is not None,
            eval_time_s=eval_time_s,
            evaluations=evals,
            target_accuracy=self.accuracy if self.accuracy > 0 else None,
            target_eval_loss=self.eval_loss if self.eval_loss > 0 else None,
            reached=reached,
        )
