"""XLA's persistent compilation cache for every jaxpar run, and what it saved.

A compiled program is stored on disk under a key of everything that decides it (the program,
the devices, XLA_FLAGS, jaxlib's version), so a later process that builds the same program
loads it instead of compiling it again: a second identical run, `--explain` after a run,
bench rows that share stage programs, planner candidates and `jaxpar.predict --validate`.

Where it lives (`config.compile_cache`, `enable`):

- "auto" (the default): `$JAX_COMPILATION_CACHE_DIR` if the environment sets it (the bench
  points each sweep's rows at OUT/xla-cache, the test suite at a temporary directory), else
  the user's cache directory, `$XDG_CACHE_HOME/jaxpar/xla` (`~/.cache/jaxpar/xla`), which
  every run shares; `JAX_ENABLE_COMPILATION_CACHE=false` turns it off;
- a path: that directory;
- "" or "off": no cache; every program compiles.

Every program is stored, however small or quick to compile (JAX's own thresholds skip those
under one second), unless `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` or
`JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES` says otherwise. Processes may share a directory:
JAX 0.10.2 writes an entry in place, so a process reading while another writes could read half
an entry (JAX then warns and compiles), and two writers of one entry could leave it corrupt for
good; here each entry is written beside its name and renamed over it, so a reader sees the
whole entry or none. In a multi-process run only process 0 writes (JAX's rule). The cache is
code that runs: keep it where only you can write (the default directory is made 0700).

`counts()` tallies every program JAX builds in this process (JAX's monitoring events): how
many, the seconds each compile or cache load took, and how many came from the cache; the
trainer puts them in the run's summary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
import threading
from collections.abc import Iterator

from jaxpar import jax_internals
from jaxpar.summary_record import CompileCacheFigures

logger = logging.getLogger(__name__)

AUTO = "auto"
OFF = ("", "off")

_ENV_DIR = "JAX_COMPILATION_CACHE_DIR"
_ENV_ENABLE = "JAX_ENABLE_COMPILATION_CACHE"
# JAX's thresholds (a program is stored only if it took this long to compile / is this big)
# and the values jaxpar sets unless the environment names them: store everything.
_THRESHOLDS = {
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": -1,  # -1: no size threshold
}

_applied: tuple[bool, str | None] | None = None  # what enable() last told JAX


def default_dir() -> str:
    """The user's cache directory for XLA programs: $XDG_CACHE_HOME/jaxpar/xla, else
    ~/.cache/jaxpar/xla."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxpar", "xla")


def directory(setting: str = AUTO) -> str | None:
    """The directory `setting` (config.compile_cache) names, or None for no cache."""
    setting = str(setting).strip()
    if setting.lower() in OFF:
        return None
    if setting.lower() != AUTO:
        return os.path.abspath(os.path.expanduser(setting))
    if os.environ.get(_ENV_ENABLE, "").strip().lower() in ("0", "n", "no", "f", "false", "off"):
        return None
    if os.environ.get(_ENV_DIR):
        return os.path.abspath(os.path.expanduser(os.environ[_ENV_DIR]))
    return default_dir()


def enable(setting: str = AUTO) -> str | None:
    """Point JAX's persistent compilation cache at `setting`'s directory (or turn it off) for
    the programs this process compiles from now on; returns the directory, or None when off.
    Call it before JAX's backends compile anything that should be cached; calling it again
    with the same setting changes nothing. A directory that cannot be made is one warning
    line, and the run goes on uncached."""
    import jax

    path = directory(setting)
    if path is not None:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as e:
            logger.warning(f"compile cache off: cannot make {path} ({e.strerror})")
            path = None
    _count_compiles()
    if path is not None:
        _install_atomic_writes()
        for name, value in _THRESHOLDS.items():
            if name.upper() not in os.environ:
                jax.config.update(name, value)
    global _applied
    state = (path is not None, path)
    if state == _applied:
        return path
    jax.config.update("jax_enable_compilation_cache", path is not None)
    if path is not None:
        jax.config.update("jax_compilation_cache_dir", path)
    # JAX opens its cache once per process, at the first compile: start again from the new
    # setting (public API: jax.experimental.compilation_cache).
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()
    _applied = state
    return path


@contextlib.contextmanager
def off() -> Iterator[None]:
    """JAX's persistent compilation cache off inside the block, and as it was after. JAX reads
    its switch once per process, so the cache is reset on entry and exit (public API:
    jax.experimental.compilation_cache)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
        compilation_cache.reset_cache()


def active_dir() -> str | None:
    """The directory JAX's cache is using now (whoever set it), or None when off."""
    import jax

    if not jax.config.values.get("jax_enable_compilation_cache", True):
        return None
    return jax.config.values.get("jax_compilation_cache_dir") or None


# -- what was compiled, and what came from the cache ----------------------------------------


@dataclasses.dataclass(frozen=True)
class Counts:
    """Programs JAX built in this process so far (or between two `counts()`: subtract)."""

    programs: int = 0  # XLA programs built (compiled, or loaded from the cache)
    seconds: float = 0.0  # the time JAX measured building them (a cache load counts its read)
    lookups: int = 0  # programs looked up in the persistent cache
    hits: int = 0  # of them, loaded from it

    @property
    def misses(self) -> int:
        """Programs looked up and not found: compiled (and stored)."""
        return self.lookups - self.hits

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.programs - other.programs,
            self.seconds - other.seconds,
            self.lookups - other.lookups,
            self.hits - other.hits,
        )

    def said(self) -> str:
        """E.g. "3 of 3 programs from the compile cache", "compile cache off"."""
        if not self.lookups:
            return "compile cache off" if self.programs else "nothing compiled"
        return f"{self.hits} of {self.lookups} programs from the compile cache"


# JAX's monitoring events (JAX 0.10.2: jax/_src/compiler.py, jax/_src/dispatch.py)
_BUILT = "/jax/core/compile/backend_compile_duration"  # every program: compile or cache load
_LOOKUP = "/jax/compilation_cache/compile_requests_use_cache"
_HIT = "/jax/compilation_cache/cache_hits"

_lock = threading.Lock()
_totals = {"programs": 0, "seconds": 0.0, "lookups": 0, "hits": 0}
_listening = False


def counts() -> Counts:
    """What this process has built so far (counting starts at the first call of `counts` or
    `enable`)."""
    _count_compiles()
    with _lock:
        return Counts(**_totals)


def _on_event(event: str, **_: object) -> None:
    key = {_LOOKUP: "lookups", _HIT: "hits"}.get(event)
    if key:
        with _lock:
            _totals[key] += 1


def _on_duration(event: str, duration: float, **_: object) -> None:
    if event == _BUILT:
        with _lock:
            _totals["programs"] += 1
            _totals["seconds"] += duration


def _count_compiles() -> None:
    global _listening
    with _lock:
        if _listening:
            return
        _listening = True
    from jax import monitoring

    monitoring.register_event_listener(_on_event)
    monitoring.register_event_duration_secs_listener(_on_duration)


def summary(train_step: Counts, run: Counts) -> CompileCacheFigures:
    """The summary record's cache figures: the directory (None: off), the train step's
    programs found and compiled, and every program of the run (train step, evaluation, the
    report's analyses) with the seconds they took."""
    return CompileCacheFigures(
        compile_cache_dir=active_dir(),
        compile_cache_hits=train_step.hits,
        compile_cache_misses=train_step.misses,
        xla_programs=run.programs,
        xla_programs_cached=run.hits,
        xla_compile_s=run.seconds,
    )


# -- entries written whole ------------------------------------------------------------------


def _install_atomic_writes() -> None:
    """Make JAX's file cache write each entry by rename (module docstring). Reaches into
    jax._src (JAX 0.10.2 has no public hook for it); where that moved, JAX's own writes stay
    and one line says so."""
    try:
        module = jax_internals.resolve("jax._src.compilation_cache")
        file_cache = jax_internals.resolve("jax._src.lru_cache.LRUCache")
        suffix = jax_internals.resolve("jax._src.lru_cache._CACHE_SUFFIX")
    except jax_internals.JaxInternalsError as e:
        logger.warning(f"compile cache entries are written in place: {e}")
        return
    if getattr(module.get_file_cache, "jaxpar_atomic", False):
        return
    jax_get_file_cache = module.get_file_cache

    class WholeEntries(file_cache):
        """JAX's file cache (no size limit), each entry written beside its name and renamed."""

        def put(self, key: str, value: bytes) -> None:
            if not key:
                raise ValueError("key cannot be empty")
            final = os.path.join(str(self.path), f"{key}{suffix}")
            if os.path.exists(final):
                return
            fd, tmp = tempfile.mkstemp(prefix=".partial-", dir=str(self.path))
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(value)
                os.replace(tmp, final)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def get_file_cache(path: str):
        import jax

        # A size limit (JAX's LRU eviction, under a file lock) or a remote file system: JAX's.
        if jax.config.values.get("jax_compilation_cache_max_size", -1) != -1 or "://" in path:
            return jax_get_file_cache(path)
        return WholeEntries(path, max_size=-1), path

    get_file_cache.jaxpar_atomic = True
    module.get_file_cache = get_file_cache
