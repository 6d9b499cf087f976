"""A profile's links and what a collective costs on them. The cost formulas are the textbook
ones (bandwidth-optimal rings, Thakur et al. 2005; NCCL's "bus bandwidth" convention):

  all-reduce      2(n-1)/n x bytes / bw + 2(n-1) x latency
  all-gather      (n-1)/n x result bytes / bw + (n-1) x latency
  reduce-scatter  (n-1) x result bytes / bw + (n-1) x latency   (result = 1/n of the input)
  all-to-all      (n-1)/n x bytes / bw + (n-1) x latency
  point-to-point  bytes / bw + latency                          (collective-permute, stages)

`bw` is per device and direction: the link bandwidth times the number of rings the
collective library builds. A group that spans nodes is reduced hierarchically: reduce-scatter
inside each node, all-reduce of the 1/g share across nodes (each device over its own NIC),
all-gather inside the node. Devices are numbered in mesh order, (data, stage, tensor) row-major,
and device i sits on node i // devices_per_node. Inside a node whose devices are not all
wired to each other (a profile's `peers`: NVLink's hybrid cube mesh joins each of a DGX-1's
P100s to four of the seven others), a ring runs over its group in rank order, as NCCL 1.x
builds it, and a hop between two devices without a direct link takes the profile's `unwired`
path (through the hosts): the ring runs at its slowest hop (`ring_link`).

A link may name the collective library's other protocols (`protocols`: NCCL's LL and LL128,
src/graph/tuning.cc), each a latency once per collective, one per ring step and a fraction of
the link's bandwidth: a ring collective (all-reduce, all-gather, reduce-scatter) is priced at
the cheapest of them and the link's own (bandwidth, latency), as NCCL picks one by its cost
model. A small message goes by LL (a few us, at under half the bandwidth); a large one at the
link's own price. All-to-all and point-to-point transfers keep the link's own price.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxpar.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s per device per direction, as one ring of the library sees it
    latency: float  # seconds per ring step (one message)
    rings: int = 1  # rings the collective library runs at once over these links
    # The library's other protocols for a ring collective, as the profile gives them
    # {name: (seconds once per collective, seconds per ring step, fraction of the ring
    # bandwidth)}, held as ((name, once, per step, fraction), ...) by name; () = none
    protocols: tuple = ()

    def __post_init__(self):
        given = self.protocols
        rows = [(k, *v) for k, v in given.items()] if hasattr(given, "items") else given
        held = tuple(sorted((str(r[0]), *map(float, r[1:])) for r in rows))
        for row in held:
            if len(row) != 4 or min(row[1:3]) < 0 or not 0 < row[3] <= 1:
                raise ConfigError(
                    f"protocol {row[0]}: (seconds once, seconds per step, fraction of the "
                    f"bandwidth), latencies >= 0 and the fraction in (0, 1]; got {row[1:]}"
                )
        object.__setattr__(self, "protocols", held)

    @property
    def ring_bandwidth(self) -> float:
        return self.bandwidth * self.rings


def ring_time(wire_bytes: float, steps: int, link: Link) -> float:
    """Seconds for a ring collective that sends `wire_bytes` per device in `steps` steps:
    at the link's own bandwidth and latency per step, or a protocol's price where cheaper."""
    best = wire_bytes / link.ring_bandwidth + steps * link.latency
    for _, once, step, fraction in link.protocols:
        best = min(best, wire_bytes / (link.ring_bandwidth * fraction) + once + steps * step)
    return best


def ring_allreduce_time(nbytes: float, n: int, link: Link) -> float:
    """Bandwidth-optimal ring all-reduce of `nbytes` over n devices."""
    if n <= 1:
        return 0.0
    return ring_time(2 * (n - 1) / n * nbytes, 2 * (n - 1), link)


def allgather_time(result_bytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return ring_time((n - 1) / n * result_bytes, n - 1, link)


def reduce_scatter_time(result_bytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return ring_time((n - 1) * result_bytes, n - 1, link)


def p2p_time(nbytes: float, link: Link) -> float:
    return nbytes / link.bandwidth + link.latency if nbytes else 0.0


def group_of(axes: str, mesh_shape: dict[str, int]) -> list[int]:
    """Device indices of the group containing device 0 that varies along `axes` ("data+tensor")."""
    names, sizes = list(mesh_shape), list(mesh_shape.values())
    chosen = set(axes.split("+"))
    ranges = [range(s) if n in chosen else range(1) for n, s in zip(names, sizes)]
    ids = np.arange(math.prod(sizes)).reshape(sizes)
    return sorted(int(i) for i in ids[np.ix_(*ranges)].ravel())


def span(group: list[int], devices_per_node: int) -> tuple[int, int]:
    """(devices per node in the group, nodes the group spans)."""
    nodes = len({i // devices_per_node for i in group})
    return len(group) // nodes, nodes


def collective_time(
    kind: str, nbytes: float, group: list[int], profile
) -> float:  # hardware.Profile
    """Seconds for one collective of `kind` whose result is `nbytes` per device over `group`."""
    n = len(group)
    if n <= 1 or nbytes == 0:
        return 0.0
    local, nodes = span(group, profile.device.devices_per_node)
    if kind == "all-reduce":
        if nodes == 1:
            return ring_allreduce_time(nbytes, n, ring_link(group, profile))
        # hierarchical: reduce-scatter in the node, all-reduce of 1/local across, all-gather
        ring = ring_link(
            [
                i
                for i in group
                if i // profile.device.devices_per_node
                == group[0] // profile.device.devices_per_node
            ],
            profile,
        )
        inside = reduce_scatter_time(nbytes / local, local, ring) + allgather_time(
            nbytes, local, ring
        )
        return inside + ring_allreduce_time(nbytes / local, nodes, profile.links.inter)
    link = ring_link(group, profile) if nodes == 1 else profile.links.inter  # flat: slowest rules
    if kind == "all-gather":
        return allgather_time(nbytes, n, link)
    if kind == "reduce-scatter":
        return reduce_scatter_time(nbytes, n, link)
    if kind == "all-to-all":  # the library's sends, not a ring: the link's own price
        return allgather_time(nbytes, n, dataclasses.replace(link, protocols=()))
    return p2p_time(nbytes, link)  # collective-permute


def transfer_link(src: int, dst: int, profile) -> Link:  # hardware.Profile
    """The link a point-to-point transfer between two devices uses."""
    per = profile.device.devices_per_node
    if src // per != dst // per:
        return profile.links.inter
    return profile.links.intra if _wired(src % per, dst % per, profile) else profile.links.unwired


def ring_link(group: list[int], profile) -> Link:  # hardware.Profile
    """The link a ring over `group` (devices of one node, in rank order) runs at: `intra`,
    or the profile's `unwired` path where some hop joins two devices without a direct link."""
    per = profile.device.devices_per_node
    hops = zip(group, group[1:] + group[:1])
    if all(_wired(a % per, b % per, profile) for a, b in hops):
        return profile.links.intra
    return profile.links.unwired


def _wired(a: int, b: int, profile) -> bool:
    peers = profile.links.peers
    return peers is None or a == b or (min(a, b), max(a, b)) in peers
