"""Every part of JAX's internals that jaxpar uses, in one place, checked against the JAX it was
written for (JAX 0.10.2, pinned in requirements.txt).

JAX 0.10.2 has no public API for these, so jaxpar reaches into `jax._src`:

- whether JAX's backends have started (`jax._src.xla_bridge.backends_are_initialized`):
  `configfile.set_host_device_count` must know whether a new simulated device count can still
  take effect, and every public way to ask (`jax.devices()`, ...) starts the backends;
- this process's client of JAX's coordination service (`jax._src.distributed.global_state`
  .client) and three of its calls: `get_live_nodes` (cluster's lost-process watchdog),
  `wait_at_barrier` (cluster.finish) and `key_value_try_get` of the key JAX's preemption sync
  manager sets on a SIGTERM (`RECEIVED_PREEMPTION_NOTICE`, a name in JAX's C++: the watchdog
  reads it so that a run too stuck to reach a step boundary still sees the notice);
- where gloo listens: JAX 0.10.2 creates gloo's TCP device (`jax._src.lib._jax
  .make_gloo_tcp_collectives`, called by `jax._src.xla_bridge` when the CPU backend starts)
  without a host name, so gloo listens on the address this machine's name resolves to, which
  may face the network; `gloo_listen_on` makes that call pass one (cluster.initialize: the
  loopback coordinator's host, for a run on one machine);
- two configuration options of jax.distributed set by name (`jax.config.update`), which a later
  JAX may rename: gloo for CPU collectives, and the recoverable mode in which the coordination
  service reports a lost process instead of aborting every process.

Where JAX 0.10.2 has public API, jaxpar uses it instead: `jax.distributed.initialize`,
`is_initialized` and `shutdown`, `multihost_utils.reached_preemption_sync_point`.

Each accessor resolves what it needs when it is used; if that is not where JAX 0.10.2 keeps it,
it raises `JaxInternalsError`: one line naming what moved, the installed JAX and the one jaxpar
was written for, instead of an AttributeError deep in a thread. `check()` resolves all of them at
once; `cluster.initialize` calls it before joining a multi-process run. Nothing here imports JAX
before it is used (XLA_FLAGS must be set first).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

WRITTEN_FOR = "0.10.2"  # the JAX whose internals this module reads; requirements.txt pins it

# The key JAX's preemption sync manager sets in the coordination service on a SIGTERM (jaxlib
# 0.10.2, C++: not visible from Python; tests/test_internals.py finds it in jaxlib's library).
PREEMPTION_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"

_CLIENT = "jax._src.lib._jax.DistributedRuntimeClient"
_GLOO = "jax._src.lib._jax.make_gloo_tcp_collectives"
# Every internal used here, with what jaxpar needs it for (named in the error).
INTERNALS = {
    "jax._src.xla_bridge.backends_are_initialized": "to know whether JAX's backends started",
    "jax._src.distributed.global_state.client": "to reach the coordination service",
    f"{_CLIENT}.get_live_nodes": "to see which processes are alive",
    f"{_CLIENT}.wait_at_barrier": "to wait for every process at the end",
    f"{_CLIENT}.key_value_try_get": "to read the preemption notice",
    _GLOO: "to choose where gloo listens",
}
# jax.config options set by name (cluster.initialize).
OPTIONS = {
    "jax_cpu_collectives_implementation": "for CPU collectives across processes (gloo)",
    "jax_enable_recoverability": "to have a lost process reported instead of every one aborted",
}


class JaxInternalsError(Exception):
    """A part of JAX jaxpar relies on is not where JAX 0.10.2 keeps it (the message is one line).
    Deliberately not an ImportError, AttributeError or RuntimeError, which callers catch."""


def _moved(what: str, purpose: str) -> JaxInternalsError:
    import jax

    installed = jax.__version__
    which = f"JAX {installed}" + (
        "" if installed == WRITTEN_FOR else f" (jaxpar is written for JAX {WRITTEN_FOR})"
    )
    return JaxInternalsError(
        f"{which} has no {what}, which jaxpar uses {purpose}: install "
        f"jax=={WRITTEN_FOR} jaxlib=={WRITTEN_FOR} (requirements.txt), or port "
        "jaxpar/jax_internals.py to this JAX"
    )


def resolve(path: str) -> Any:
    """The object at dotted `path` (a module, then attributes), e.g. "jax._src.distributed
    .global_state.client"; JaxInternalsError, naming `path`, if JAX has no such thing."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable module prefix
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            break
        return obj
    raise _moved(path, INTERNALS.get(path, "internally"))


def check() -> None:
    """Resolve every internal and option above; one JaxInternalsError naming all that moved."""
    import jax

    missing = {p: why for p, why in INTERNALS.items() if not _resolves(p)}
    if _GLOO not in missing and not _takes_hostname(resolve(_GLOO)):
        missing[f"{_GLOO}(hostname=...)"] = INTERNALS[_GLOO]
    missing |= {
        f"jax.config option {o}": why for o, why in OPTIONS.items() if o not in jax.config.values
    }
    if len(missing) == 1:
        raise _moved(*next(iter(missing.items())))
    if missing:
        raise _moved(", ".join(missing), "(see jaxpar/jax_internals.py for what each is for)")


def _resolves(path: str) -> bool:
    try:
        resolve(path)
    except JaxInternalsError:
        return False
    return True


def _takes_hostname(function: Any) -> bool:
    """Whether jaxlib's function has a `hostname` argument (its signature is in its doc)."""
    return "hostname" in (getattr(function, "__doc__", None) or "")


def set_option(name: str, value: Any) -> None:
    """jax.config.update(name, value) for an option in OPTIONS, with JaxInternalsError if this
    JAX has no such option."""
    import jax

    if name not in jax.config.values:
        raise _moved(f"jax.config option {name}", OPTIONS[name])
    jax.config.update(name, value)


def backends_started() -> bool:
    """Whether JAX's backends have started (the first jax.devices() or computation), without
    starting them."""
    return bool(resolve("jax._src.xla_bridge.backends_are_initialized")())


def gloo_listen_on(host: str) -> None:
    """Make gloo (CPU collectives across processes) listen on `host` (an address of this
    machine) instead of the address the machine's name resolves to. Before the CPU backend
    starts; process-wide."""
    lib, make = resolve("jax._src.lib._jax"), resolve(_GLOO)
    original = getattr(make, "jaxpar_original", make)
    if not _takes_hostname(original):
        raise _moved(f"{_GLOO}(hostname=...)", INTERNALS[_GLOO])

    def make_on_host(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("hostname", host)
        return original(*args, **kwargs)

    make_on_host.jaxpar_original = original  # type: ignore[attr-defined]
    make_on_host.jaxpar_host = host  # type: ignore[attr-defined]
    lib.make_gloo_tcp_collectives = make_on_host


class Coordination:
    """This process's client of JAX's coordination service (hosted by process 0), as jaxpar
    uses it. Made after jax.distributed.initialize; its calls raise what JAX raises (an
    unreachable service, a key not set)."""

    def __init__(self) -> None:
        client = resolve("jax._src.distributed.global_state.client")
        if client is None:
            raise RuntimeError("jax.distributed.initialize has not been called")
        self._live = self._method(client, "get_live_nodes")
        self._barrier = self._method(client, "wait_at_barrier")
        self._try_get = self._method(client, "key_value_try_get")

    @staticmethod
    def _method(client: Any, name: str) -> Any:
        method = getattr(client, name, None)
        if method is None:
            raise _moved(f"{_CLIENT}.{name}", INTERNALS[f"{_CLIENT}.{name}"])
        return method

    def live_processes(self, processes: Iterable[int]) -> set[int]:
        """Which of `processes` the service still hears from."""
        return set(self._live(list(processes)))

    def wait_at_barrier(self, name: str, timeout_s: float) -> None:
        """Block until every process reached the barrier `name` (raises after `timeout_s`)."""
        self._barrier(name, int(timeout_s * 1000))

    def preemption_notice(self) -> bool:
        """Whether any process got a preemption notice (JAX's handler of SIGTERM set its key).
        False too if the service cannot be reached."""
        try:
            self._try_get(PREEMPTION_NOTICE_KEY)
        except Exception:  # noqa: BLE001 - not set (NOT_FOUND), or the service is gone
            return False
        return True
