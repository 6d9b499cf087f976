"""The gradient reduction's hidden part (commtime.hidden): each collective at its own link
price, so a step of many small all-reduces (synchronised BatchNorm's) beside a large
asynchronous gradient one keeps the small ones' latency exposed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jaxpar.predict.comm import commtime, links, overlap
from jaxpar.predict.comm.overlap import Window
from tests.test_overlap import PROGRAM
from tests.util import tiny_profile

W = SimpleNamespace(mesh_shape={"data": 8})

# One all-reduce over 8 devices at 360 GB/s and 5 us a ring step: 2 x 7/8 x bytes / 360e9
# + 2 x 7 x 5 us.
SMALL = 2 * 7 / 8 * 8192 / 360e9 + 70e-6  # 8 KiB: 70.04 us, nearly all latency
BIG = 2 * 7 / 8 * 29e6 / 360e9 + 70e-6  # 29 MB: 0.2110 ms


def test_a_large_async_all_reduce_hides_only_its_own_time():
    """100 small all-reduces with no work between start and done and one 29 MB gradient
    all-reduce with half the step's work under it: the window hides the large one (0.211 ms)
    and none of the small ones' 7.0 ms. Split by bytes (the old rule) the large one would
    carry 97% of the 7.2 ms and hide 7.0 ms."""
    profile = tiny_profile(intra=links.Link(360e9, 5e-6), overlap=None)
    small = [Window("all-reduce", "data", 8192, 0.1, 0.0) for _ in range(100)]
    big = Window("all-reduce", "data", 29_000_000, 0.5, 0.5)
    grad = 100 * SMALL + BIG
    got = commtime.hidden([*small, big], grad, 0.020, W, profile)
    assert got == pytest.approx(BIG)
    assert grad - got == pytest.approx(100 * SMALL)  # exposed: 7.004 ms


def test_a_combined_all_reduce_pays_its_latency_once():
    """XLA's combined all-reduce (a tuple of an 8 KiB and a 16 KiB gradient over 2 devices)
    is one collective: its elements' times are one all-reduce of 24 KiB (one latency, 2 x
    5 us), split 1:2 by bytes."""
    profile = tiny_profile(intra=links.Link(360e9, 5e-6), overlap=None)
    wins = overlap.windows(PROGRAM, {"data": 2})
    assert wins[0].whole is None  # the asynchronous one stands alone
    combined = [x for x in wins if x.whole]
    assert [x.whole for x in combined] == [24576, 24576]
    times = commtime.window_times(combined, {"data": 2}, profile)
    whole = 24576 / 360e9 + 10e-6  # 2 x 1/2 x bytes / bw + 2 x latency
    assert times == pytest.approx([whole / 3, 2 * whole / 3])


def test_without_latency_the_split_is_by_bytes_as_before():
    """On latency-free links every collective costs its bytes: the shares are the bytes'
    (0.25 and 0.75 of `grad`), each capped by its window (a quarter of the compute)."""
    profile = tiny_profile(intra=links.Link(10e9, 0.0), overlap=None)
    wins = [Window("all-reduce", "data", n, 0.0, 0.25) for n in (1_000, 3_000)]
    assert commtime.hidden(wins, 1.0, 1.0, W, profile) == pytest.approx(0.25 + 0.25)
    assert commtime.hidden(wins, 1.0, 4.0, W, profile) == pytest.approx(0.25 + 0.75)
