"""What a step hands an adapting learning rate (lr_adaptation=adascale, jaxpar/adascale.py),
and what it reports of it: shared by every strategy's step body."""

from __future__ import annotations

from jaxpar import adascale
from jaxpar.errors import ConfigError
from jaxpar.run_spec import RateRule


def adapting_noise(rate: RateRule, sq_small, groups: int | str) -> adascale.GradNoise | None:
    """The step's gradient norms for an adapting rate (the combined gradient's squared norm
    left for the sync rule to fill in), or None when the rate does not adapt. `groups`: the
    strategy's noise_groups(), the small batches of a step (or why it measures none)."""
    if rate.adaptation == "none":
        return None
    if not isinstance(groups, int):
        raise ConfigError(refusal(rate.adaptation, groups))
    big = rate.batch
    return adascale.GradNoise(sq_small, None, big / groups, big)


def refusal(adaptation: str, reason: str) -> str:
    """The one line refusing an adapting rate (lr_adaptation) where the noise is not measured."""
    return (
        f"lr_adaptation={adaptation} takes its gain from the gradient noise scale, "
        f"which this run does not measure: {reason}"
    )


def adapted_metrics(state: adascale.AdaScaleState | None) -> dict:
    """The step's gain, the progress after it and the rate it applied, as step metrics."""
    if state is None:
        return {}
    return {"gain": state.gain, "progress": state.progress, "learning_rate": state.rate}
