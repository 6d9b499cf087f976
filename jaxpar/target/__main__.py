"""`python -m jaxpar.target --from-run PATH`: a reference run as the steps model reads it, and
the steps to its target it predicts at other global batches.

    python -m jaxpar.target --from-run runs/ref --batches 16,256,1024
    python -m jaxpar.target --from-run trace.json --target-accuracy 0.9

PATH is a run's workdir or a JSON file (jaxpar/target/reading.py). Nothing is compiled.
"""

from __future__ import annotations

import argparse
import sys

from jaxpar import oneline
from jaxpar.errors import ConfigError
from jaxpar.target import reading


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxpar.target", description=__doc__)
    parser.add_argument("--from-run", "--from_run", dest="from_run", required=True)
    parser.add_argument("--target-accuracy", "--target_accuracy", dest="target", type=float)
    parser.add_argument(
        "--batches", default="", help="global batches, comma-separated (default: B0 x 1/4 .. x 32)"
    )
    args = parser.parse_args(argv)
    try:
        ref = reading.load(args.from_run, args.target)
        batches = _batches(args.batches, ref.batch_size)
    except ConfigError as e:
        oneline.print_error(oneline.first_line(e))
        return 2
    print(f"{ref.source}: {ref.target or 'its target'}")
    print(ref.describe())
    spans = ", ".join(f"{a}-{b}: {_phi(m)}" for a, b, m in ref.phases())
    print(f"B_simple by steps: {spans}")
    if caveat := ref.caveat():
        print(f"note: {caveat}")
    print("\n| batch | steps along the trace | steps with one B_noise |")
    print("|---|---|---|")
    for b in batches:
        print(f"| {b} | {ref.steps(b):,.0f} | {ref.steps_one_average(b):,.0f} |")
    return 0


def _batches(text: str, base: int) -> list[int]:
    if not text.strip():
        return sorted({max(1, base // 4), base, *(base * 2**k for k in range(1, 6))})
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise ConfigError(f"--batches {text!r}: comma-separated integers") from None
    if not batches or min(batches) < 1:
        raise ConfigError(f"--batches {text!r}: each batch must be >= 1")
    return batches


def _phi(value: float) -> str:
    return "not settled" if value == float("inf") else f"{value:,.0f}"


if __name__ == "__main__":
    sys.exit(main())
