"""What an adapting learning rate (lr_adaptation=adascale) did over a run: each step's gain
and the progress after it, read from the step's metrics when the log window is written
(metrics.jsonl's "noise" lines carry them), and the summary's figures."""

from __future__ import annotations

from collections.abc import Iterable

from jaxpar.summary_record import AdaptedProgress


class AdaptedRate:
    """Per step, the gain and the progress after it (continued from metrics.jsonl on a
    resume: `replay`)."""

    def __init__(self) -> None:
        self.gains: dict[int, float] = {}
        self.progress: dict[int, float] = {}

    def add(self, step: int, gain: float, progress: float) -> dict[str, float]:
        """One step's figures in; the fields its noise line gains out."""
        self.gains[step], self.progress[step] = gain, progress
        return {"gain": gain, "progress": progress}

    def replay(self, records: Iterable[dict]) -> None:
        """The steps of a resumed run, from its noise lines."""
        for r in records:
            if r.get("gain") is not None:
                self.add(int(r["step"]), float(r["gain"]), float(r["progress"]))

    def summary(self, target_step: int | None = None) -> AdaptedProgress | None:
        """The progress at the end, the mean gain per step, and the progress at the step a
        target was reached (when one was and its step is known); None before any step."""
        if not self.progress:
            return None
        last = max(self.progress)
        return AdaptedProgress(
            progress=self.progress[last],
            mean_gain=self.progress[last] / last,
            progress_to_target=(
                self.progress[target_step]
                if target_step is not None and target_step in self.progress
                else None
            ),
        )
