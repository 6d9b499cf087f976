"""How long the embedded digits dataset takes to generate: the full 60,000 + 10,000 images.

Run:  python benchmarks/digits_generation.py [--train 60000] [--eval 10000] [--repeats 1]

Each repeat calls the uncached generator (`digits.generate.__wrapped__`), so nothing is reused
between repeats; the figure is the wall time of one train + eval draw (target: under 30 s on
two CPU cores).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxpar.data import digits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=digits.NUM_TRAIN)
    parser.add_argument("--eval", type=int, default=digits.NUM_EVAL)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.repeats):
        start = time.perf_counter()
        digits.generate.__wrapped__(args.train, "train")
        train_s = time.perf_counter() - start
        digits.generate.__wrapped__(args.eval, "eval")
        total_s = time.perf_counter() - start
        print(
            f"digits: {args.train} train + {args.eval} eval images in {total_s:.1f} s "
            f"(train {train_s:.1f} s, {(args.train + args.eval) / total_s:,.0f} images/s)"
        )


if __name__ == "__main__":
    main()
