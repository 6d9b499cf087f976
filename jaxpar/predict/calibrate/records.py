"""--calibrate-here's measured figures as typed records: the first device's microbenchmarks
(device_rates.microbenchmarks) and the memory-bound kernels' costs from the rows' kernel traces
(model_runs.traced_costs). A profile file written here keeps them as its MEASURED dict
(`as_record`, the keys in the order they were measured); `of_record` reads one back."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class TracedCosts:
    """What the rows' kernel traces gave; a field is None where it was not reached (`skipped`
    says why the costs are not used)."""

    rows: list[str] | None = None  # the traced rows' folders
    not_traced: list[str] | None = None  # why a row was not traced
    named_share: float | None = None  # the least share of a trace's kernel time named
    skipped: str | None = None
    kernel_s: float | None = None
    memory_bandwidth: float | None = None
    memory_kernel_costs: dict[str, tuple[float, float]] | None = None  # (fixed s, bytes/s)
    kernels: dict[str, int] | None = None  # the kernels of each class fitted

    def as_record(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in values.items() if v is not None}

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> TracedCosts:
        return cls(**record)


# the figures measured once for each dtype, as MEASURED names them: f"matmul_{dtype}" ...
_BY_DTYPE = ("matmul_{}", "{}_flops_per_s", "thin_conv_{}", "narrow_conv_{}")
_FIELD_OF = {"matmul_{}": "matmul", "{}_flops_per_s": "flops_per_s"}
_FIELD_OF |= {"thin_conv_{}": "thin_conv", "narrow_conv_{}": "narrow_conv"}


@dataclasses.dataclass(frozen=True)
class Microbenchmarks:
    """The first device's figures (device_rates.microbenchmarks), by dtype where timed per
    dtype; `traced` and `devices_here` are added by --calibrate-here after them."""

    platform: str
    device_kind: str
    jax: str
    seconds: float  # each timing's length
    num_devices: int  # the profile's node
    matmul: dict[str, dict[int, float]]  # FLOP/s by matrix side
    flops_per_s: dict[str, float]  # the largest matmul's
    thin_conv: dict[str, float]  # a first layer's convolution and its weight gradient
    narrow_conv: dict[str, dict[int, float]]  # on a GPU: a 3x3 layer by its output features
    matmul_flops_per_s: float
    memory_bandwidth_array_bytes: int
    memory_bandwidth: float
    launch_s: float
    sync_call_s: float
    kernel_s: float
    peak_memory_bytes: float
    traced: TracedCosts | None = None
    devices_here: int | None = None  # the devices here, where num_devices is the node's

    def as_record(self) -> dict[str, Any]:
        """MEASURED as a profile file writes it."""
        out: dict[str, Any] = {
            "platform": self.platform,
            "device_kind": self.device_kind,
            "jax": self.jax,
            "seconds": self.seconds,
            "num_devices": self.num_devices,
        }
        for dtype in self.matmul:
            for name in _BY_DTYPE:
                by = getattr(self, _FIELD_OF[name])
                if dtype in by:
                    out[name.format(dtype)] = by[dtype]
        names = ("matmul_flops_per_s", "memory_bandwidth_array_bytes", "memory_bandwidth")
        names += ("launch_s", "sync_call_s", "kernel_s", "peak_memory_bytes")
        out |= {name: getattr(self, name) for name in names}
        if self.traced is not None:
            out["traced"] = self.traced.as_record()
        if self.devices_here is not None:
            out["devices_here"] = self.devices_here
        return out

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> Microbenchmarks:
        dtypes = [k[len("matmul_") :] for k in record if k.startswith("matmul_")]
        dtypes = [d for d in dtypes if f"{d}_flops_per_s" in record]
        by = {
            field: {d: record[name.format(d)] for d in dtypes if name.format(d) in record}
            for name, field in _FIELD_OF.items()
        }
        rest = {f.name for f in dataclasses.fields(cls)} - set(by) - {"traced"}
        traced = record.get("traced")
        return cls(
            **by,
            **{k: record[k] for k in rest if k in record},
            traced=TracedCosts.of_record(traced) if traced is not None else None,
        )
