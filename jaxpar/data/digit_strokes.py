"""The pen-stroke templates of the embedded digits dataset (jaxpar/data/digits.py renders them).

Each class has a few styles (1 with and without a flag, 7 with and without a bar, open and
closed 4, ...), each a weight and a list of strokes; a stroke is a polyline in the unit box
(x right, y down, the digit about 0.6 wide and 1 high). The weights are relative within a class.
"""

from __future__ import annotations

import numpy as np


def _arc(cx, cy, rx, ry, start, stop, n):
    """n points on an ellipse from angle `start` to `stop` in degrees (y down: 90 = bottom)."""
    a = np.radians(np.linspace(start, stop, n))
    return np.stack([cx + rx * np.cos(a), cy + ry * np.sin(a)], 1)


def _smooth(points, per_span=3):
    """A Catmull-Rom curve through `points`, sampled `per_span` times a span."""
    p = np.asarray(points, np.float64)
    p = np.concatenate([2 * p[:1] - p[1:2], p, 2 * p[-1:] - p[-2:-1]])
    t = np.arange(per_span)[:, None] / per_span
    out = []
    for i in range(1, len(p) - 2):
        p0, p1, p2, p3 = p[i - 1], p[i], p[i + 1], p[i + 2]
        out.append(
            0.5
            * (
                2 * p1
                + (p2 - p0) * t
                + (2 * p0 - 5 * p1 + 4 * p2 - p3) * t**2
                + (3 * p1 - p0 - 3 * p2 + p3) * t**3
            )
        )
    return np.concatenate(out + [p[-2:-1]])


def _eight(n=25):
    """A one-stroke figure eight: top loop on the right first, then the bottom loop."""
    t = np.linspace(0, 2 * np.pi, n)
    return np.stack(
        [0.5 + 0.27 * np.sin(2 * t) / (1.3 + 0.3 * np.cos(t)), 0.5 - 0.5 * np.cos(t)], 1
    )


# Styles of each class: (weight, strokes); a stroke is a polyline in the unit box (x right,
# y down, the digit about 0.6 wide and 1 high). The weights are relative within a class.
STYLES = {
    0: [
        (30, [_arc(0.5, 0.5, 0.28, 0.48, -90, 270, 15)]),
        (10, [_arc(0.5, 0.5, 0.22, 0.48, -110, 285, 15)]),  # Narrow, overlapping at the top.
        (10, [_arc(0.5, 0.5, 0.34, 0.46, -60, 250, 14)]),  # Round, left open at the top.
    ],
    1: [
        (40, [[(0.5, 0.0), (0.5, 1.0)]]),
        (30, [[(0.3, 0.2), (0.5, 0.0), (0.5, 1.0)]]),  # With a flag.
        (10, [[(0.32, 0.18), (0.5, 0.0), (0.5, 1.0)], [(0.3, 1.0), (0.72, 1.0)]]),  # And a foot.
        (3, [[(0.22, 0.3), (0.52, 0.0), (0.48, 1.0)]]),  # Long flag: near a 7.
    ],
    2: [
        (
            30,
            [np.concatenate([_arc(0.5, 0.3, 0.27, 0.28, 170, 400, 9), [(0.2, 1.0), (0.82, 1.0)]])],
        ),
        (
            20,
            [
                np.concatenate(
                    [
                        _arc(0.5, 0.3, 0.27, 0.28, 165, 380, 8),
                        _smooth([(0.74, 0.45), (0.45, 0.75), (0.2, 0.97)])[1:],
                        [(0.82, 0.98)],
                    ]
                )
            ],
        ),
        (
            10,  # With a loop at the foot.
            [
                np.concatenate(
                    [
                        _arc(0.5, 0.3, 0.27, 0.28, 170, 400, 9),
                        _smooth([(0.36, 0.83), (0.22, 0.97), (0.33, 1.0), (0.34, 0.86)])[1:],
                        _smooth([(0.34, 0.86), (0.5, 1.0), (0.82, 0.96)])[1:],
                    ]
                )
            ],
        ),
    ],
    3: [
        (
            30,
            [_arc(0.47, 0.26, 0.25, 0.24, 200, 450, 9), _arc(0.47, 0.74, 0.29, 0.26, -90, 160, 9)],
        ),
        (
            10,  # Flat top.
            [
                np.concatenate(
                    [
                        [(0.22, 0.0), (0.75, 0.0), (0.42, 0.42)],
                        _arc(0.45, 0.71, 0.3, 0.29, -80, 155, 9),
                    ]
                )
            ],
        ),
        (
            2,  # Left ends curled in: near an 8.
            [_arc(0.5, 0.26, 0.25, 0.24, 160, 450, 10), _arc(0.5, 0.74, 0.29, 0.26, -90, 200, 11)],
        ),
    ],
    4: [
        (20, [[(0.62, 0.0), (0.15, 0.66), (0.86, 0.66)], [(0.64, 0.3), (0.64, 1.0)]]),  # Closed.
        (20, [[(0.24, 0.0), (0.2, 0.6), (0.84, 0.6)], [(0.66, 0.05), (0.66, 1.0)]]),  # Open.
        (10, [[(0.24, 0.05), (0.2, 0.58), (0.62, 0.6), (0.64, 0.0), (0.64, 1.0)]]),  # One stroke.
        (2, [[(0.42, 0.0), (0.2, 0.58), (0.84, 0.58)], [(0.66, 0.15), (0.64, 1.0)]]),  # Near a 9.
    ],
    5: [
        (
            30,
            [
                np.concatenate(
                    [
                        [(0.76, 0.0), (0.3, 0.0), (0.26, 0.43)],
                        _arc(0.47, 0.69, 0.29, 0.3, 220, 505, 10),
                    ]
                )
            ],
        ),
        (
            20,  # The flag drawn apart from the body.
            [
                np.concatenate(
                    [[(0.3, 0.0), (0.27, 0.43)], _arc(0.47, 0.69, 0.29, 0.3, 220, 505, 10)]
                ),
                [(0.32, 0.0), (0.8, -0.03)],
            ],
        ),
        (
            2,  # Belly nearly closed: near a 6.
            [
                np.concatenate(
                    [
                        [(0.72, 0.0), (0.32, 0.02), (0.24, 0.45)],
                        _arc(0.48, 0.7, 0.27, 0.28, 215, 530, 11),
                    ]
                )
            ],
        ),
    ],
    6: [
        (
            30,
            [
                np.concatenate(
                    [
                        _smooth([(0.72, 0.02), (0.45, 0.16), (0.28, 0.45), (0.25, 0.72)])[:-1],
                        _arc(0.5, 0.73, 0.25, 0.25, 180, 540, 13),
                    ]
                )
            ],
        ),
        (
            20,  # Straight stem, small loop.
            [[(0.66, 0.0), (0.3, 0.62)], _arc(0.5, 0.77, 0.22, 0.21, 0, 360, 12)],
        ),
    ],
    7: [
        (40, [[(0.2, 0.0), (0.8, 0.0), (0.42, 1.0)]]),
        (20, [[(0.2, 0.0), (0.8, 0.0), (0.42, 1.0)], [(0.36, 0.52), (0.76, 0.5)]]),  # With a bar.
        (10, [[(0.2, 0.14), (0.2, 0.0), (0.8, 0.0), (0.45, 1.0)]]),  # With a hook.
        (3, [[(0.42, 0.02), (0.72, 0.0), (0.55, 1.0)]]),  # Short top: near a 1.
    ],
    8: [
        (30, [_arc(0.5, 0.25, 0.22, 0.24, 0, 360, 12), _arc(0.5, 0.73, 0.27, 0.26, 0, 360, 12)]),
        (30, [_eight()]),
    ],
    9: [
        (30, [_arc(0.46, 0.27, 0.25, 0.26, 0, 360, 13), [(0.71, 0.27), (0.66, 1.0)]]),
        (
            20,  # Curved tail.
            [
                _arc(0.46, 0.27, 0.25, 0.26, 0, 360, 13),
                _smooth([(0.71, 0.27), (0.69, 0.7), (0.52, 0.98), (0.3, 0.93)]),
            ],
        ),
        (
            10,
            [
                np.concatenate(
                    [_arc(0.45, 0.28, 0.25, 0.27, -20, 330, 12), [(0.7, 0.2), (0.7, 1.0)]]
                )
            ],
        ),
    ],
}
