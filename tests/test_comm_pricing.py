"""What a step's collectives cost on a profile's links: each call at its own size
(commtime.collectives_time over a row's `sizes`)."""

from __future__ import annotations

import dataclasses

import pytest

from jaxpar import collectives
from jaxpar.predict.comm import commtime, links
from jaxpar.predict.programs.workload import Collective
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


# NCCL's ring protocols over NVLink (tuning.cc; configs/hardware/h100_sxm_x8.py), LL here at
# half the bandwidth for round numbers: (once, per step, fraction of the bandwidth)
PROTOCOLS = {"LL": (6.6e-6, 0.6e-6, 0.5), "LL128": (14e-6, 1.9e-6, 0.92)}


def _protocols():
    return tiny_profile(intra=links.Link(360e9, 5e-6, protocols=PROTOCOLS))


def test_a_small_call_takes_the_low_latency_protocol():
    """An 8-device all-reduce (wire bytes 2 x 7/8 of the payload, 14 ring steps) at the
    cheapest of the link's own price and its protocols': 8 KiB by LL, 6.6 + 14 x 0.6 us +
    14,336 B / 180 GB/s = 15.08 us (70.04 us at the link's own); 29 MB by LL128, 14 + 14 x
    1.9 us + 50.75 MB / 331.2 GB/s = 193.8 us (211.0); 1 GB at the link's own, 4,931 us."""
    profile, group = _protocols(), list(range(8))
    price = lambda n: links.collective_time("all-reduce", n, group, profile)
    assert price(8192) == pytest.approx(15e-6 + 14336 / 180e9)
    assert price(29e6) == pytest.approx(40.6e-6 + 50.75e6 / (0.92 * 360e9))
    assert price(1e9) == pytest.approx(1.75e9 / 360e9 + 70e-6)
    # a ring all-gather of 8 KiB: 7 steps, 7/8 x 8 KiB, by LL
    gather = links.collective_time("all-gather", 8192, group, profile)
    assert gather == pytest.approx(6.6e-6 + 7 * 0.6e-6 + 7168 / 180e9)


def test_sends_keep_the_links_own_price():
    """All-to-all and a collective-permute are the library's sends, not a ring: no
    protocol applies."""
    plain, profile = _nvlink(), _protocols()
    for kind in ("all-to-all", "collective-permute"):
        got = links.collective_time(kind, 8192, list(range(8)), profile)
        assert got == links.collective_time(kind, 8192, list(range(8)), plain)


def test_per_call_sizes_matter_with_a_second_protocol():
    """100 x 8 KiB by LL (15.08 us each) and 29 MB by LL128 (193.8 us): 1.702 ms; merged into
    101 calls of the mean size (295,240 B, by LL: 17.87 us each) they would cost 1.805 ms."""
    sizes = (8192,) * 100 + (29_000_000,)
    row = Collective("all-reduce", "data", 101, sum(sizes), sizes)
    merged = Collective("all-reduce", "data", 101, sum(sizes))
    small = 15e-6 + 14336 / 180e9
    big = 40.6e-6 + 50.75e6 / (0.92 * 360e9)
    assert commtime.collectives_time([row], MESH, _protocols()) == pytest.approx(100 * small + big)
    mean = 15e-6 + 1.75 * sum(sizes) / 101 / 180e9
    assert commtime.collectives_time([merged], MESH, _protocols()) == pytest.approx(101 * mean)


def test_a_profile_names_its_protocols():
    """The profile file's {name: (once, per step, fraction)} is held by name; a link
    without the key has none; a fraction outside (0, 1] is refused; a link replaced keeps
    its protocols."""
    from jaxpar.errors import ConfigError
    from jaxpar.predict.profiles import hardware

    base = tiny_profile()
    config = {
        **hardware.fields(base),
        "name": "p",
        "intra": {"bandwidth": 1e9, "latency": 1e-6, "protocols": {"LL": [1e-6, 2e-7, 0.5]}},
        "inter": {"bandwidth": 1e9, "latency": 1e-6},
    }
    profile = hardware.from_config(config)
    assert profile.links.intra.protocols == (("LL", 1e-6, 2e-7, 0.5),)
    assert profile.links.inter.protocols == ()
    with pytest.raises(ConfigError, match="LL"):
        links.Link(1e9, 1e-6, protocols={"LL": (0.0, 0.0, 1.5)})
    link = profile.links.intra  # a link replaced keeps its protocols
    assert dataclasses.replace(link, bandwidth=2e9).protocols == link.protocols
