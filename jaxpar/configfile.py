"""Config files by path, `--config.KEY=VALUE` overrides, and the simulated CPU device count.

    config = configfile.load("configs/vgg19_hybrid.py")          # its get_config()
    overrides, rest = configfile.split_overrides(sys.argv[1:])    # {"model.width": 0.5}, [...]
    configfile.override(config, overrides)                        # unknown keys refused
    configfile.set_host_device_count(config.host_device_count)    # before JAX's first use
    configfile.cpu_only()                                         # the predictor, the tests

`python -m jaxpar.train` parses its flags with absl's `config_flags` (lock_config=True); the
bench, the planner, the predictor, the benchmarks and the tests parse `--config.KEY=VALUE` with
the same `config_flags`, against configs/base.py's fields (`split_overrides`), and set the
values on each config or row (`override`). This module imports neither JAX nor anything of
jaxpar, so an entry point can call it before JAX is configured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections
from absl import flags
from ml_collections import config_flags

from jaxpar import jax_internals
from jaxpar.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def make_configs_importable() -> None:
    """Let config files say `from configs import base` from any working directory."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)


def load(path: str) -> ml_collections.ConfigDict:
    """`get_config()` of the Python file at `path` (FileNotFoundError if there is none, a
    ConfigError if it has no get_config or fails to run: a syntax error, a bad import)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such config file {path!r}")
    make_configs_importable()
    name = f"_config_{os.path.splitext(os.path.basename(path))[0]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        if not callable(getattr(module, "get_config", None)):
            raise ConfigError(f"{path} has no get_config(): not a config, suite or profile file")
        return module.get_config()
    except ConfigError:
        raise
    except Exception as e:  # the file's own error, named in one line
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"{path} does not load: {type(e).__name__}: {first}") from e


# The --help epilog of the entry points that take `--config.KEY=VALUE` besides argparse's options.
OVERRIDES_HELP = (
    "--config.KEY=VALUE (any number) sets one key of the experiment config (of every row, for\n"
    "a suite), e.g. --config.global_batch_size=256 --config.mesh_shape='(4,1,1)'\n"
    "--config.model.dtype=bfloat16; every key, and what it means, is in configs/base.py."
)


def split_overrides(args: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """The `--config.KEY=VALUE` arguments as {KEY: VALUE}, and the other arguments.

    Each VALUE is read by ml_collections' `config_flags`, as `python -m jaxpar.train` reads it:
    against configs/base.py (every experiment config derives from it and adds no key), by the
    type of the field there ('(2,2,2)' for a tuple, true/false for a bool, a Python literal for
    a field of no declared type). A KEY base.py lacks, or a VALUE config_flags refuses for the
    field's type, is kept as its text: `override` then refuses it (unknown key, wrong type) in
    the one line each entry point already prints for a bad override.
    """
    texts, rest = {}, []
    for arg in args:
        match = re.fullmatch(r"--config\.([\w.]+)=(.*)", arg, re.DOTALL)
        if match:
            texts.pop(match.group(1), None)  # the last one given wins, in its place
            texts[match.group(1)] = match.group(2)
        else:
            rest.append(arg)
    make_configs_importable()
    from configs import base

    known = {key for key in texts if has_key(base.get_config(), key)}
    overrides = {k: _parsed(base.get_config(), k, t) if k in known else t for k, t in texts.items()}
    return overrides, rest


def _parsed(schema: ml_collections.ConfigDict, key: str, text: str) -> Any:
    """`--config.KEY=TEXT` as config_flags parses it for `schema`'s field KEY (its own flag
    values, not absl's global ones); TEXT itself where config_flags refuses it."""
    argv = ["configfile", f"--config.{key}={text}"]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_dict(
        "config", schema, flag_values=flag_values, lock_config=True, sys_argv=argv
    )
    try:
        flag_values(argv)
    except flags.Error:  # e.g. 'abc' for an int: override's type check says so in one line
        return text
    return config_flags.get_override_values(flag_values["config"])[key]


def override_args(overrides: Mapping[str, Any]) -> list[str]:
    """`overrides` as the `--config.KEY=VALUE` arguments a user types, which `split_overrides`
    and train read back as the same values: a string as itself, a bool as true/false, a tuple
    (or a list) as a Python tuple without spaces ("data" in double quotes, for the shell)."""
    return [f"--config.{key}={_text(value)}" for key, value in overrides.items()]


def _text(value: Any, inner: bool = False) -> str:
    if isinstance(value, tuple | list):
        items = ",".join(_text(v, inner=True) for v in value)
        return f"({items}{',' if len(value) == 1 else ''})"
    if isinstance(value, str):
        return json.dumps(value) if inner else value
    if isinstance(value, bool) and not inner:
        return "true" if value else "false"
    return repr(value)


def has_key(config: ml_collections.ConfigDict, key: str) -> bool:
    """Whether dotted `key` ("model.width") names a field of `config`."""
    node = config
    for part in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return False
        node = node[part]
    return True


def override(
    config: ml_collections.ConfigDict, overrides: Mapping[str, Any], *, new_keys: bool = False
) -> ml_collections.ConfigDict:
    """Set dotted keys on `config` as `--config.KEY=VALUE` would, and return it. Lists become
    tuples (the command line's form). A key the config lacks raises KeyError("unknown config
    key 'KEY'") before anything is set, unless `new_keys` (then a new leaf is added, as
    ml_collections' `update_from_flattened_dict` does); a value of the wrong type raises
    ConfigDict's TypeError."""
    flat = {}
    for key, value in overrides.items():
        if not new_keys and not has_key(config, key):
            raise KeyError(f"unknown config key {key!r}")
        flat[key] = tuple(value) if isinstance(value, list) else value
    config.update_from_flattened_dict(flat)
    return config


def host_device_count() -> int | None:
    """The simulated CPU device count XLA_FLAGS asks for, or None (the last one counts)."""
    found = re.findall(rf"{HOST_DEVICES_FLAG}=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(found[-1]) if found else None


def with_host_devices(count: int | None, flags: str | None = None) -> str:
    """XLA_FLAGS (`flags`, by default this process's) asking for `count` simulated CPU devices
    (None: no count, XLA's default of one) in place of any count they ask for; every other flag
    kept. The one place that writes the flag: for this process (`set_host_device_count`), the
    workers launch/local.py starts, and the tests' subprocesses."""
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    kept = re.sub(rf"\s*{HOST_DEVICES_FLAG}=\d+", "", flags).strip()
    return kept if count is None else f"{kept} {HOST_DEVICES_FLAG}={count}".strip()


def set_host_device_count(count: int, *, replace: bool = False) -> int:
    """Ask XLA for `count` simulated CPU devices; return the count in effect.

    A count XLA_FLAGS already sets wins (`config.validate` then explains a mesh that does not
    fit), unless `replace`. A count of 1 or less adds no flag: one device is XLA's default.
    XLA reads the flag when JAX starts its backends (the first `jax.devices()` or computation),
    so importing JAX first is fine; once the backends run, asking for another count raises
    RuntimeError instead of silently keeping the old one.
    """
    given = host_device_count()
    if given is not None and not replace:
        return given
    started = _started_count()
    if started is not None and started != max(count, 1):
        raise RuntimeError(
            f"JAX's CPU backend already runs with {started} device(s), so "
            f"{HOST_DEVICES_FLAG}={count} cannot take effect: set the count before anything "
            "calls jax.devices() or computes"
        )
    current = os.environ.get("XLA_FLAGS", "")
    flags = with_host_devices(count if count > 1 else None, current)
    if flags != current:
        os.environ["XLA_FLAGS"] = flags
    return count


def cpu_only() -> None:
    """Run JAX on its CPU backend only, unless JAX_PLATFORMS already says otherwise: for
    programs that compile for hardware other than this machine's. JAX reads JAX_PLATFORMS when
    it is imported; once it is, the setting goes through jax.config (before the backends start).
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if "jax" in sys.modules:
        sys.modules["jax"].config.update("jax_platforms", os.environ["JAX_PLATFORMS"])


def _started_count() -> int | None:
    """CPU devices of the JAX backends already running in this process; None if none runs yet
    (or JAX has no CPU backend here)."""
    if "jax" not in sys.modules:
        return None
    # JAX has no public way to ask without starting them
    if not jax_internals.backends_started():
        return None
    import jax

    try:
        return len(jax.local_devices(backend="cpu"))
    except RuntimeError:  # no CPU backend
        return None
