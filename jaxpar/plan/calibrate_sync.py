"""`python -m jaxpar.plan --target-accuracy A --calibrate-sync [MODE:SETTING,...]`: the steps
an approximate sync mode needs over allreduce, measured on the planned model itself by paired
runs to the target (the same config, seed and batch, only the sync mode changed), instead of
the constants measured on LeNet and the digits (jaxpar/target/sync_factors.py), which do not
transfer to another model, optimizer or rate.

The factors are written as sync_factors.json beside the reference (in its workdir, or as
FILE.sync_factors.json beside its JSON file), where every later plan from that reference
reads them (reference.Reference.sync_factors).
"""

from __future__ import annotations

from pathlib import Path

from jaxpar import configfile, trainer
from jaxpar.errors import ConfigError
from jaxpar.files import write_json
from jaxpar.target import reading
from jaxpar.target.reference import Reference
from jaxpar.target.sync_factors import SETTING_KEYS, MeasuredFactor, MeasuredFactors

FILE = reading.SYNC_FACTORS_FILE


def settings(text: str, config) -> list[tuple[str, int]]:
    """The (mode, setting) pairs to measure: `text` as "local_sgd:4,async:1", or by default
    local SGD at the config's period and async at its largest staleness."""
    if not text.strip():
        return [("local_sgd", int(config.sync.period)), ("async", int(config.sync.max_staleness))]
    out = []
    for part in text.split(","):
        mode, _, value = part.strip().partition(":")
        if mode not in SETTING_KEYS or not value.isdigit() or int(value) < 1:
            raise ConfigError(
                f"--calibrate-sync {part.strip()!r}: MODE:SETTING with MODE one of "
                f"{', '.join(SETTING_KEYS)} and a setting >= 1, e.g. local_sgd:4,async:1"
            )
        out.append((mode, int(value)))
    return out


def calibrate(config, pairs: list[tuple[str, int]], accuracy: float, out: Path) -> MeasuredFactors:
    """Train `config` to `accuracy` under allreduce and under each (mode, setting) of `pairs`
    (runs in OUT/sync/), and return the factors as sync_factors.json holds them."""
    common = {
        "target_accuracy": accuracy,
        "stop_at_target": True,
        "eval_every_steps": config.eval_every_steps or max(1, config.num_train_steps // 20),
        "checkpoint_every_steps": 0,
        "lr_adaptation": "none",  # the approximate modes form no combined gradient to adapt by
    }
    runs = [("allreduce", 0)] + pairs
    steps = {}
    for mode, setting in runs:
        changes = {**common, "sync.mode": mode}
        if mode in SETTING_KEYS:
            changes[SETTING_KEYS[mode]] = setting
        name = mode if mode == "allreduce" else f"{mode}_{setting}"
        print(f"\ncalibrating the sync step factors: {name} to accuracy {accuracy:g}", flush=True)
        run = configfile.override(config.copy_and_resolve_references(), changes)
        result = trainer.train_and_evaluate(run, str(out / "sync" / name))
        steps[(mode, setting)] = result.summary.steps_to_target if result.summary else None
    base = steps[("allreduce", 0)]
    if not base:
        raise ConfigError(
            f"--calibrate-sync: allreduce did not reach accuracy {accuracy:g} in "
            f"{config.num_train_steps} steps; raise --config.num_train_steps"
        )
    factors = []
    for mode, setting in pairs:
        reached = steps[(mode, setting)]
        factors.append(
            MeasuredFactor(
                mode=mode,
                setting=setting,
                steps_to_target=reached,
                allreduce_steps_to_target=base,
                factor=reached / base if reached else None,
                at_least=None if reached else config.num_train_steps / base,
            )
        )
    return MeasuredFactors(
        global_batch_size=int(config.global_batch_size),
        seed=int(config.seed),
        target_accuracy=accuracy,
        factors=tuple(factors),
    )


def store(record: MeasuredFactors, reference: Reference) -> Path:
    """sync_factors.json beside the reference: in its workdir, or as FILE.sync_factors.json
    beside its JSON file (where reading.measured_sync_factors reads it)."""
    source = Path(reference.source)
    path = source / FILE if source.is_dir() else source.with_suffix(f".{FILE}")
    write_json(str(path), record.as_record())
    return path


def table(record: MeasuredFactors) -> list[str]:
    lines = [
        "| mode | setting | steps to target | allreduce's | step factor |",
        "|---|---|---|---|---|",
    ]
    for f in record.factors:
        base = f.allreduce_steps_to_target
        reached = f.steps_to_target or f"not in {f.at_least * base:.0f}"
        factor = f"{f.factor:.2f}" if f.factor else f"> {f.at_least:.2f}"
        lines.append(f"| {f.mode} | {f.setting} | {reached} | {base} | {factor} |")
    return lines
