"""What a step hands an adapting learning rate (lr_adaptation=adascale, jaxpar/adascale.py),
and what it reports of it: shared by every strategy's step body."""

from __future__ import annotations

from jaxpar import adascale
from jaxpar.errors import ConfigError


def adapting_noise(config, sq_small, groups: int | str) -> adascale.GradNoise | None:
    """The step's gradient norms for an adapting rate (the combined gradient's squared norm
    left for the sync rule to fill in), or None when the rate does not adapt. `groups`: the
    strategy's noise_groups(), the small batches of a step (or why it measures none)."""
    if config.get("lr_adaptation", "none") == "none":
        return None
    if not isinstance(groups, int):
        raise ConfigError(refusal(config, groups))
    big = config.global_batch_size
    return adascale.GradNoise(sq_small, None, big / groups, big)


def refusal(config, reason: str) -> str:
    """The one line refusing an adapting rate where the noise is not measured."""
    return (
        f"lr_adaptation={config.lr_adaptation} takes its gain from the gradient noise scale, "
        f"which this run does not measure: {reason}"
    )


def adapted_metrics(state: adascale.AdaScaleState | None) -> dict:
    """The step's gain, the progress after it and the rate it applied, as step metrics."""
    if state is None:
        return {}
    return {"gain": state.gain, "progress": state.progress, "learning_rate": state.rate}
