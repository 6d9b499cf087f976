"""The sweep's results table as markdown (results.md): one line per row, the figures read from
the programs ([exact]) apart from this machine's clock ([clock]), and the cells other tables
share (mesh, MiB, numbers). Pure functions over the aggregated rows of results.py."""

from __future__ import annotations

from jaxpar import axes
from jaxpar.bench.row_record import BenchRow

HEADER = (
    "Figures marked [exact] are read from the placed arrays and the compiled programs: bytes, "
    "memory, FLOPs per image and the analytic bubble do not depend on the machine. Figures "
    "marked [clock] are this machine's wall clock: images/sec, speedup, efficiency, step "
    "time, compile time and the measured bubble. On simulated CPU devices every device shares "
    "the same physical cores, so wall-clock speedup is bounded by the core count, not by the "
    "device count."
)


def mesh_cell(r: BenchRow) -> str:
    """A row's mesh in a table: "(2,1,1)" on the default (data, stage, tensor) axes, else
    named, "(node=2,data=4)"."""
    sizes, names = r.mesh_shape, tuple(r.mesh_axes or axes.DEFAULT)
    if not sizes:
        return ""
    if names == axes.DEFAULT:
        return "(" + ",".join(str(x) for x in sizes) + ")"
    return "(" + ",".join(f"{a}={n}" for a, n in zip(names, sizes)) + ")"


def mib_cell(n) -> str:
    return "" if n is None else f"{n / 2**20:.2f}"


def number_cell(n, fmt: str) -> str:
    return "" if n is None else format(n, fmt)


def markdown(rows: list[BenchRow], machine: str = "") -> str:
    """The results table: one line per row, [exact] and [clock] columns marked."""
    head = (
        "| row | mesh | dev | img/s [clock] | speedup | eff. | loader img/s [clock] | "
        "memory/dev MiB [exact] | "
        "coll. MiB/dev/step [exact] | data AR / params | stage-to-stage MiB/step [exact] | "
        "bubble analytic / measured | eval acc | status |"
    )
    mfu = any(r.mfu is not None for r in rows)  # a device whose peak jaxpar knows (GPUs)
    if mfu:
        head = head.replace(" | eval acc |", " | MFU [clock] | eval acc |")
    lines = [
        f"*{machine}*\n" if machine else "",
        HEADER,
        "",
        head,
        "|" + "---|" * (15 if mfu else 14),
    ]
    for r in rows:
        rate = number_cell(r.images_per_sec, ".1f")
        if r.images_per_sec_stderr is not None:
            rate += f" ± {r.images_per_sec_stderr:.1f}"
        bubble = ""
        if r.analytic_bubble is not None:
            bubble = f"{r.analytic_bubble:.3f} / {number_cell(r.measured_bubble, '.3f')}"
        mesh = mesh_cell(r)
        status = "ok" if r.status == "ok" else f"failed: {r.error}"
        cells = [
            r.name,
            mesh,
            str(r.num_devices or ""),
            rate,
            number_cell(r.speedup, ".2f"),
            number_cell(r.efficiency, ".2f"),
            _loader(r),
            mib_cell(r.memory_bytes_per_device),
            _coll(r),
            number_cell(r.data_allreduce_over_params, ".3f"),
            mib_cell(r.bytes_between_stages),
            bubble,
            number_cell(r.eval_accuracy, ".3f"),
            status,
        ]
        if mfu:  # model FLOPs per second over the devices' peak
            cells.insert(12, "" if r.mfu is None else f"{100 * r.mfu:.1f}%")
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines).lstrip("\n") + "\n"


def _coll(r: BenchRow) -> str:
    """Collective MiB per device per step, with the halo exchanges' share where there are
    some (spatial)."""
    cell = mib_cell(r.collective_bytes_per_device)
    if r.halo_bytes_per_device:
        cell += f" (halo {mib_cell(r.halo_bytes_per_device)})"
    return cell


def _loader(r: BenchRow) -> str:
    """The loader column: "bound" for an input-bound row, else the loader's capacity."""
    return "bound" if r.input_bound else number_cell(r.loader_images_per_sec, ".0f")
