"""optax optimisers and learning-rate schedules from the config."""

from __future__ import annotations

import ml_collections
import optax

from jaxpar import adascale

ADAPTATIONS = ("none", "adascale")  # lr_adaptation: how the rate follows the measured noise


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


def adaptation(config: ml_collections.ConfigDict) -> str:
    """How the rate follows the measured noise during the run: "none" or "adascale"."""
    return config.get("lr_adaptation", "none")


def batch_rule(config: ml_collections.ConfigDict) -> str:
    """Which rule sets the rate across batch sizes: "linear", "noise" or "none" (AdaScale's
    runs: "adascale", the gain scales the rate step by step)."""
    if adaptation(config) == "adascale":
        return "adascale"
    if config.lr_linear_scaling:
        return "linear"
    return "noise" if config.get("lr_noise_scale", 0.0) > 0 else "none"


def peak_learning_rate(config: ml_collections.ConfigDict) -> float:
    """The configured peak rate, scaled from lr_base_batch_size to global_batch_size by the
    config's rule (`batch_rule`): learning_rate is the rate for lr_base_batch_size images."""
    return batch_scaled_rate(
        batch_rule(config),
        float(config.learning_rate),
        config.get("lr_base_batch_size", 256),
        config.global_batch_size,
        config.get("lr_noise_scale", 0.0),
    )


def schedule_steps(config: ml_collections.ConfigDict) -> int:
    """The steps the learning-rate schedule spans: `schedule_steps`, or num_train_steps (0)."""
    return int(config.schedule_steps or config.num_train_steps)


def schedule_meta(config: ml_collections.ConfigDict) -> dict:
    """What fixes the learning rate at every step: stored with checkpoints, so that continuing
    a run never changes the rate of its steps behind the user's back (resume.check_schedule)."""
    meta = {
        "lr_schedule": config.lr_schedule,
        "peak_learning_rate": peak_learning_rate(config),
        "warmup_steps": int(config.warmup_steps),
        "schedule_steps": schedule_steps(config),
    }
    if adaptation(config) != "none":  # its schedule runs on progress, not steps
        meta["lr_adaptation"] = adaptation(config)
    return meta


def make_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """Linear warmup from 0 to the peak, then cosine decay to 0 over `schedule_steps` (or
    constant); after its end the rate stays at the end value."""
    peak = peak_learning_rate(config)
    span = schedule_steps(config)
    warmup = min(config.warmup_steps, span)
    if config.lr_schedule == "constant":
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


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """SGD (momentum, optional Nesterov), Adam or LARS, with `weight_decay` applied as follows.

    adam: decoupled weight decay (AdamW, Loshchilov & Hutter): the update gains
    -lr * weight_decay * param, outside Adam's normalisation.
    sgd: weight_decay * param is added to the gradient before momentum (the classic SGD weight
    decay of Caffe, TensorFlow and PyTorch); without momentum it equals the decoupled form.
    lars: optax.lars (You et al. 2017, layer-wise adaptive rates): each parameter's step is
    scaled by trust_coefficient x ||w|| / ||g + wd w||, with weight decay inside that ratio.
    """
    schedule = make_schedule(config)
    opt, wd = config.optimizer, float(config.weight_decay)
    if adaptation(config) == "adascale":
        return _adascale_optimizer(config, schedule)
    if opt.name == "adam":
        return optax.adamw(schedule, weight_decay=wd)  # decoupled; wd=0 is plain Adam
    if opt.name == "lars":
        return optax.lars(
            schedule,
            weight_decay=wd,
            momentum=opt.momentum,
            nesterov=opt.nesterov,
            trust_coefficient=opt.trust_coefficient,
        )
    tx = optax.sgd(schedule, momentum=opt.momentum or None, nesterov=opt.nesterov)
    if wd:
        tx = optax.chain(optax.add_decayed_weights(wd), tx)
    return tx


def _adascale_optimizer(config: ml_collections.ConfigDict, schedule: optax.Schedule):
    """optax's sgd and adamw chains with their last link, the learning rate, replaced by
    AdaScale's (the rate at the progress times the gain; jaxpar/adascale.py)."""
    opt, wd = config.optimizer, float(config.weight_decay)
    rate = adascale.scale_by_adascale(
        schedule, int(config.lr_base_batch_size), float(config.noise_scale_decay)
    )
    if opt.name == "adam":
        return optax.chain(optax.scale_by_adam(), optax.add_decayed_weights(wd), rate)
    momentum = optax.trace(opt.momentum, opt.nesterov) if opt.momentum else optax.identity()
    chain = optax.chain(momentum, rate)
    return optax.chain(optax.add_decayed_weights(wd), chain) if wd else chain
