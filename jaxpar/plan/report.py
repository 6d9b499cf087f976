"""The plan as printed: the ranked candidates' table, what was predicted and left out, and
the recommendation with the command that trains it."""

from __future__ import annotations

from jaxpar.plan.reasons import command, unpriced, why
from jaxpar.plan.records import PlanRow
from jaxpar.plan.refusals import commonest
from jaxpar.plan.search import rank


def _ms(s: float) -> str:
    return f"{1e3 * s:.1f}" if s >= 1e-3 or s == 0 else f"{1e3 * s:.3f}"


def table(rows: list[PlanRow], profile) -> str:
    """The ranked candidates as a markdown table."""
    head = (
        "| rank | mesh | schedule | M | remat | v | sync | img/s | speedup | step ms | "
        "compute | comm | bubble | overhead | GiB/device | why |"
    )
    lines = [head, "|" + "---|" * 16]
    for i, r in enumerate(rows, 1):
        c, p = r.candidate, r.predicted
        piped = bool(c.schedule)
        sync = c.sync if c.replicas > 1 else "-"
        sync += "" if c.exact else "*"
        speed = f"{r.speedup:.2f}" if r.speedup else "-"
        lines.append(
            f"| {i} | {c.name.split(' ')[0]} | {c.schedule or '-'} | "
            f"{c.microbatches if piped else '-'} | "
            f"{('yes' if c.remat else 'no') if piped else '-'} | "
            f"{c.virtual if piped else '-'} | {sync} | {p.images_per_sec:,.0f} | {speed} | "
            f"{_ms(p.step_time_s)} | {_ms(p.compute_s)} | {_ms(p.comm_s)} | "
            f"{_ms(p.bubble_s)} | {_ms(p.overhead_s)} | "
            f"{p.memory_bytes_per_device / 2**30:.2f} | {why(r, profile)} |"
        )
    return "\n".join(lines)


def report(
    result,
    profile,
    limit: float,
    top: int,
    config_file: str,
    config,
    extra: dict,
    expand: int = 3,
    max_candidates: int = 40,
) -> tuple[str, str | None, str | None]:
    """(the printed report, the recommendation line, its command) for a Plan."""
    fitting, too_big = rank(result.rows, limit)
    lines = _counts(result, fitting, too_big, expand, max_candidates)
    lines += _ranked(fitting, too_big, profile, limit, top)
    said, recommendation, cmd = _recommend(fitting, profile, config_file, config, extra)
    return "\n".join(lines + said), recommendation, cmd


def _counts(
    result, fitting: list[PlanRow], too_big: list[PlanRow], expand: int, max_candidates: int
) -> list[str]:
    """What was considered, refused, predicted and left out, and the failed predictions."""
    lines: list[str] = []
    say = lines.append
    failed = [r for r in result.rows if not r.ok]
    reasons = commonest(result.refused, 1)
    common = f" (commonest, {reasons[0][1]}x: {reasons[0][0]})" if reasons else ""
    say(
        f"\n{result.considered + len(result.refused)} candidates: {len(result.refused)} refused "
        f"by the trainer{common}"
        + f"; {len(result.rows)} predicted ({len(fitting)} fit, {len(too_big)} do not"
        + (f", {len(failed)} failed" if failed else "")
        + f"); {result.skipped} not predicted (round 2 expands the best {expand} meshes; "
        f"--max_candidates {max_candidates})"
    )
    if result.meshes_unseen:
        say(
            f"round 1 reached {result.meshes - result.meshes_unseen} of {result.meshes} meshes: "
            f"--max_candidates {result.meshes + 1} or more tries each once"
        )
    for r in failed:
        say(f"  failed: {r.name}: {r.predicted.error}")
    return lines


def _ranked(
    fitting: list[PlanRow], too_big: list[PlanRow], profile, limit: float, top: int
) -> list[str]:
    """The table of the `top` that fit `limit`, and the faster ones that do not."""
    lines: list[str] = []
    say = lines.append
    if fitting:
        say(
            f"\nTop {min(top, len(fitting))} of {len(fitting)} that fit "
            f"{limit / 2**30:.2f} GiB per device (speedup: against the 1-device row):\n"
        )
        say(table(fitting[:top], profile))
        if any(unpriced(r) for r in fitting[:top]):
            say(
                "\nNOT priced: the predictor prices collectives it cannot place on mesh axes "
                "(shown as '?') at 0 s, so those rows are optimistic"
            )
        if any(not r.candidate.exact for r in fitting[:top]):
            say("\n* not the same function as one device (approximate synchronisation)")
    else:
        need = min((r.predicted.memory_bytes_per_device for r in too_big), default=0)
        say(
            f"\nnone of the predicted candidates fits {limit / 2**30:.2f} GiB per device"
            + (f"; the smallest needs {need / 2**30:.2f} GiB" if too_big else "")
        )
    faster = [
        r
        for r in too_big
        if not fitting or r.predicted.step_time_s < fitting[0].predicted.step_time_s
    ]
    if faster:
        say("\nFaster, but do not fit:")
        for r in faster[:3]:
            say(
                f"  {r.name}: {r.predicted.images_per_sec:,.0f} img/s, needs "
                f"{r.predicted.memory_bytes_per_device / 2**30:.2f} GiB per device, limit "
                f"{limit / 2**30:.2f} GiB"
            )
    return lines


def _recommend(fitting: list[PlanRow], profile, config_file: str, config, extra: dict):
    """(its lines, the recommendation, its command): the fastest fitting row whose traffic
    is all priced."""
    lines: list[str] = []
    say = lines.append
    recommendation = cmd = None
    priced = [r for r in fitting if not unpriced(r)]
    if fitting and priced and priced[0] is not fitting[0]:
        say(
            f"\n(recommending {priced[0].name}, not {fitting[0].name}: the latter's "
            "prediction leaves some of its traffic unpriced)"
        )
    if fitting:
        best = (priced or fitting)[0]
        speed = f", {best.speedup:.2f}x one device" if best.speedup else ""
        recommendation = (
            f"{best.name}: {best.predicted.images_per_sec:,.0f} img/s predicted{speed}, "
            f"{best.predicted.memory_bytes_per_device / 2**30:.2f} GiB per device; "
            f"{why(best, profile)}"
        )
        cmd = command(config_file, best, config, extra)
        say(f"\nrecommendation: {recommendation}\n  {cmd}")
    else:
        say(
            "\nrecommendation: none fits; raise --memory_gib, lower global_batch_size or the "
            "model's width, or plan for more devices"
        )
    return lines, recommendation, cmd
