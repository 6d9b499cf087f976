"""Standard CIFAR augmentation, vectorised: zero-pad 4, random crop, random h-flip.

Zero padding (not reflect) matches the ResNet paper, tf_cnn_benchmarks and
torchvision's RandomCrop(padding=4). The random draws are separate from the
pixel work so a caller can draw them for a whole global batch and apply a slice.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

PAD = 4


@dataclasses.dataclass(frozen=True)
class AugmentParams:
    """Per-example crop offsets (into the padded image) and flip flags."""

    dy: np.ndarray  # int [n], in [0, 2 * PAD]
    dx: np.ndarray  # int [n], in [0, 2 * PAD]
    flip: np.ndarray  # bool [n]

    def local(self, part: slice) -> AugmentParams:
        """The parameters of one slice of the batch."""
        return AugmentParams(self.dy[part], self.dx[part], self.flip[part])


def draw_params(rng: np.random.Generator, n: int, pad: int = PAD) -> AugmentParams:
    """Draws crop offsets and flips for `n` examples, in a fixed order."""
    dy = rng.integers(0, 2 * pad + 1, size=n)
    dx = rng.integers(0, 2 * pad + 1, size=n)
    flip = rng.random(n) < 0.5
    return AugmentParams(dy=dy, dx=dx, flip=flip)


def pad_crop_flip(images: np.ndarray, params: AugmentParams, pad: int = PAD) -> np.ndarray:
    """Zero-pads [n, H, W, C] images, crops HxW at (dy, dx), mirrors where flip.

    Crops are gathered from a strided view of all windows (no per-example loop),
    flipped ones through a reversed view, so each output pixel is copied once.
    """
    n, h, w, _ = images.shape
    if len(params.dy) != n:
        raise ValueError(f"got augmentation parameters for {len(params.dy)} images, not {n}")
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    # windows[i, dy, dx] is the HxWxC crop of image i at offset (dy, dx); a view.
    windows = np.moveaxis(sliding_window_view(padded, (h, w), axis=(1, 2)), 3, -1)
    index = np.arange(n)
    out = np.empty_like(images)
    keep, flip = ~params.flip, params.flip
    out[keep] = windows[index[keep], params.dy[keep], params.dx[keep]]
    out[flip] = windows[index[flip], params.dy[flip], params.dx[flip], :, ::-1]
    return out
