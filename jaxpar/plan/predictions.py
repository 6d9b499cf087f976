"""The candidates predicted so far in a search (`Predictions`): each candidate's plan row from
the predictor (a refusal while building joins the refused), one progress line a prediction."""

from __future__ import annotations

import time

from jaxpar import oneline, units
from jaxpar.plan.candidates import Candidate
from jaxpar.plan.records import PlanRow
from jaxpar.predict import PredictedRow
from jaxpar.predict.programs import gputarget
from jaxpar.predict.programs.workload import collective_calls, workload


class Predictions:
    """The candidates predicted so far: `done` (candidate -> row, or None where the strategy
    refused it while building, which joins `refused`), the rows in prediction order, and one
    progress line per prediction through `say`."""

    def __init__(self, predict, config, profile, refused: list, limit: float, most: int, say):
        self.predict, self.config, self.profile, self.refused = predict, config, profile, refused
        self.limit, self.most, self.say = limit, most, say
        self.rows: list[PlanRow] = []
        self.done: dict[Candidate, PlanRow | None] = {}
        self.t0 = time.perf_counter()

    def run(self, batch: list[Candidate], round_name: str) -> None:
        """Predict the candidates of `batch` not yet predicted, while the bound allows."""
        batch = [c for c in dict.fromkeys(batch) if c not in self.done]
        room = self.most - len(self.done)
        total_planned = len(self.done) + min(len(batch), room)
        for c in batch[: max(room, 0)]:
            t = time.perf_counter()
            row = _predict_one(self.predict, self.config, c, self.profile, self.refused)
            self.done[c] = row
            if row is not None:
                self.rows.append(row)
            elapsed = time.perf_counter() - self.t0
            rate = len(self.done) / elapsed if elapsed else 0.0
            eta = (total_planned - len(self.done)) / rate if rate else 0.0
            self.say(
                _progress_line(
                    len(self.done),
                    total_planned,
                    round_name,
                    c,
                    row,
                    self.limit,
                    time.perf_counter() - t,
                    rate,
                    eta,
                )
            )


def _predict_one(predict, config, c: Candidate, profile, refused: list) -> PlanRow | None:
    """The candidate's predicted row; a refusal at build time joins `refused` (None)."""
    try:
        row = predict(c.apply(config), profile)
    except ValueError as e:  # ConfigError: the strategy refused it while building
        refused.append((c, oneline.first_line(e)))
        return None
    except Exception as e:  # noqa: BLE001 - one candidate's failure is its row, not the plan's
        row = PredictedRow(status="failed", error=f"{type(e).__name__}: {oneline.first_line(e)}")
    calls = None
    if row.ok and predict_is_default(predict):
        calls = _calls(c.apply(config), profile)
    return PlanRow(row, c, collective_calls_per_step=calls)


def predict_is_default(predict) -> bool:
    return getattr(predict, "__module__", "") == "jaxpar.predict"


def _calls(config, profile) -> dict[str, int]:
    """Collective calls per step by "kind axes", from the predictor's cached workload ({} if
    it cannot be read: the predictor's internals are not this module's contract)."""
    try:
        out: dict[str, int] = {}
        for key, col, times in collective_calls(
            workload(config, profile.device.num_devices, gputarget.of(profile))
        ):
            out[key] = out.get(key, 0) + col.count * times
        return out
    except Exception:  # noqa: BLE001
        return {}


def _progress_line(i, total, round_name, c, row, limit, took, rate, eta) -> str:
    if row is None:
        what = "refused while building"
    elif not row.ok:
        what = f"failed: {row.predicted.error}"
    else:
        p = row.predicted
        fit = "" if p.memory_bytes_per_device <= limit else "  does not fit"
        what = f"{1e3 * p.step_time_s:9.3f} ms  {p.memory_bytes_per_device / 2**30:6.2f} GiB{fit}"
    return (
        f"[{i:3d}/{total}] {round_name}  {c.name:<44} {what}  ({took:.1f} s; "
        f"{rate:.2f}/s, ETA {units.clock(eta)})"
    )
