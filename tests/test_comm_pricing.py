"""What a step's collectives cost on a profile's links: each call at its own size
(commtime.collectives_time over a row's `sizes`)."""

from __future__ import annotations

import pytest

from jaxpar import collectives
from jaxpar.predict import commtime, links
from jaxpar.predict.workload import Collective
from tests.test_overlap import PROGRAM
from tests.util import tiny_profile

MESH = {"data": 8}

# One all-reduce over 8 devices at 360 GB/s and 5 us a ring step: 2 x 7/8 x bytes / 360e9
# + 2 x 7 x 5 us.
SMALL = 2 * 7 / 8 * 8192 / 360e9 + 70e-6  # 8 KiB: 70.04 us
BIG = 2 * 7 / 8 * 29e6 / 360e9 + 70e-6  # 29 MB: 0.2110 ms


def _nvlink():
    return tiny_profile(intra=links.Link(360e9, 5e-6))


def test_a_program_keeps_each_collective_size():
    """The async all-reduce (8 KiB) and the combined one (8 + 16 KiB) of one program: two
    calls, each its own size; the (count, bytes) row is their sum."""
    assert collectives.collective_sizes(PROGRAM, {"data": 2}) == {
        ("all-reduce", "data"): [8192, 24576]
    }
    assert collectives.collective_rows(PROGRAM, {"data": 2}, times=3) == {
        ("all-reduce", "data"): [6, 3 * 32768]
    }


def test_each_call_is_priced_at_its_own_size():
    """100 BatchNorm-sized all-reduces and one 29 MB gradient one: 100 + 1 latencies and
    each one's bytes, 7.21 ms. (One protocol's ring price is linear in the bytes, so this
    is also what 101 calls of the mean size cost; a link with a second protocol for small
    messages is not: test_a_small_call_takes_the_low_latency_protocol.)"""
    sizes = (8192,) * 100 + (29_000_000,)
    row = Collective("all-reduce", "data", 101, sum(sizes), sizes)
    got = commtime.collectives_time([row], MESH, _nvlink())
    assert got == pytest.approx(100 * SMALL + BIG)


def test_a_row_of_one_size_prices_as_count_times_one():
    """Calls all of one size: exactly count x the price of bytes / count, as a row without
    sizes (the workload's rows before they carried them)."""
    profile = _nvlink()
    plain = Collective("all-reduce", "data", 3, 3 * 8192)
    sized = Collective("all-reduce", "data", 3, 3 * 8192, (8192,) * 3)
    assert commtime.collectives_time([sized], MESH, profile) == commtime.collectives_time(
        [plain], MESH, profile
    )
    assert commtime.collectives_time([plain], MESH, profile) == pytest.approx(3 * SMALL)
