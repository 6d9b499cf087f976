"""optax optimisers and learning-rate schedules from a run's rate rule (run_spec.RateRule)."""

from __future__ import annotations

import optax

from jaxpar import adascale
from jaxpar.run_spec import RateRule


def batch_scaled_rate(rule: str, lr: float, base_batch: int, batch: int, noise: float = 0.0):
    """The rate for `batch` images given `lr` for `base_batch`: "none" keeps it, "linear"
    scales it by batch / base_batch (Goyal et al. 2017), "noise" follows McCandlish et al.'s
    optimal rate eps(B) = eps_max / (1 + B_noise / B) with eps_max fixed by (base_batch, lr)."""
    if rule == "linear":
        return lr * batch / base_batch
    if rule == "noise":
        return lr * (1 + noise / base_batch) / (1 + noise / batch)
    if rule in ("none", "adascale"):  # adascale: the gain scales it step by step
        return lr
    raise ValueError(f"unknown learning-rate rule {rule!r}; choose none, linear or noise")


def batch_rule(rate: RateRule) -> str:
    """Which rule sets the rate across batch sizes: "linear", "noise" or "none" (AdaScale's
    runs: "adascale", the gain scales the rate step by step)."""
    if rate.adaptation == "adascale":
        return "adascale"
    if rate.linear_scaling:
        return "linear"
    return "noise" if rate.noise_scale > 0 else "none"


def peak_learning_rate(rate: RateRule) -> float:
    """The configured peak rate, scaled from lr_base_batch_size to global_batch_size by the
    config's rule (`batch_rule`): learning_rate is the rate for lr_base_batch_size images."""
    return batch_scaled_rate(
        batch_rule(rate), rate.learning_rate, rate.base_batch, rate.batch, rate.noise_scale
    )


def schedule_steps(rate: RateRule) -> int:
    """The steps the learning-rate schedule spans: `schedule_steps`, or num_train_steps (0)."""
    return int(rate.schedule_steps or rate.train_steps)


def schedule_meta(rate: RateRule) -> dict:
    """What fixes the learning rate at every step: stored with checkpoints, so that continuing
    a run never changes the rate of its steps behind the user's back (resume.check_schedule)."""
    meta = {
        "lr_schedule": rate.schedule,
        "peak_learning_rate": peak_learning_rate(rate),
        "warmup_steps": rate.warmup_steps,
        "schedule_steps": schedule_steps(rate),
    }
    if rate.adaptation != "none":  # its schedule runs on progress, not steps
        meta["lr_adaptation"] = rate.adaptation
    return meta


def make_schedule(rate: RateRule) -> optax.Schedule:
    """Linear warmup from 0 to the peak, then cosine decay to 0 over `schedule_steps` (or
    constant); after its end the rate stays at the end value."""
    peak = peak_learning_rate(rate)
    span = schedule_steps(rate)
    warmup = min(rate.warmup_steps, span)
    if rate.schedule == "constant":
        if warmup == 0:
            return optax.constant_schedule(peak)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak)], [warmup]
        )
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=peak,
        warmup_steps=warmup,
        decay_steps=max(span, warmup + 1),
        end_value=0.0,
    )


def make_optimizer(rate: RateRule) -> optax.GradientTransformation:
    """SGD (momentum, optional Nesterov), Adam or LARS, with `weight_decay` applied as follows.

    adam: decoupled weight decay (AdamW, Loshchilov & Hutter): the update gains
    -lr * weight_decay * param, outside Adam's normalisation.
    sgd: weight_decay * param is added to the gradient before momentum (the classic SGD weight
    decay of Caffe, TensorFlow and PyTorch); without momentum it equals the decoupled form.
    lars: optax.lars (You et al. 2017, layer-wise adaptive rates): each parameter's step is
    scaled by trust_coefficient x ||w|| / ||g + wd w||, with weight decay inside that ratio.
    """
    schedule = make_schedule(rate)
    wd = rate.weight_decay
    if rate.adaptation == "adascale":
        return _adascale_optimizer(rate, schedule)
    if rate.optimizer == "adam":
        return optax.adamw(schedule, weight_decay=wd)  # decoupled; wd=0 is plain Adam
    if rate.optimizer == "lars":
        return optax.lars(
            schedule,
            weight_decay=wd,
            momentum=rate.momentum,
            nesterov=rate.nesterov,
            trust_coefficient=rate.trust_coefficient,
        )
    tx = optax.sgd(schedule, momentum=rate.momentum or None, nesterov=rate.nesterov)
    if wd:
        tx = optax.chain(optax.add_decayed_weights(wd), tx)
    return tx


def _adascale_optimizer(rate: RateRule, schedule: optax.Schedule):
    """optax's sgd and adamw chains with their last link, the learning rate, replaced by
    AdaScale's (the rate at the progress times the gain; jaxpar/adascale.py)."""
    wd = rate.weight_decay
    scale = adascale.scale_by_adascale(schedule, rate.base_batch, rate.noise_scale_decay)
    if rate.optimizer == "adam":
        return optax.chain(optax.scale_by_adam(), optax.add_decayed_weights(wd), scale)
    momentum = optax.trace(rate.momentum, rate.nesterov) if rate.momentum else optax.identity()
    chain = optax.chain(momentum, scale)
    return optax.chain(optax.add_decayed_weights(wd), chain) if wd else chain
