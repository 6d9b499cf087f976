"""optax optimisers and learning-rate schedules from the config."""

from __future__ import annotations

import ml_collections
import optax


def peak_learning_rate(config: ml_collections.ConfigDict) -> float:
    """The configured peak rate, linearly scaled by global_batch_size / 256 if asked."""
    lr = float(config.learning_rate)
    if config.lr_linear_scaling:
        lr *= config.global_batch_size / 256
    return lr


def make_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """Linear warmup from 0 to the peak, then cosine decay to 0 (or constant)."""
    peak = peak_learning_rate(config)
    warmup = min(config.warmup_steps, config.num_train_steps)
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
        decay_steps=max(config.num_train_steps, warmup + 1),
        end_value=0.0,
    )


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """SGD (momentum, optional Nesterov) or Adam, with `weight_decay` applied as follows.

    adam: decoupled weight decay (AdamW, Loshchilov & Hutter): the update gains
    -lr * weight_decay * param, outside Adam's normalisation.
    sgd: weight_decay * param is added to the gradient before momentum (the classic SGD weight
    decay of Caffe, TensorFlow and PyTorch); without momentum it equals the decoupled form.
    """
    schedule = make_schedule(config)
    opt, wd = config.optimizer, float(config.weight_decay)
    if opt.name == "adam":
        return optax.adamw(schedule, weight_decay=wd)  # decoupled; wd=0 is plain Adam
    tx = optax.sgd(schedule, momentum=opt.momentum or None, nesterov=opt.nesterov)
    if wd:
        tx = optax.chain(optax.add_decayed_weights(wd), tx)
    return tx
