"""Test set-up: eight simulated CPU devices (whatever XLA_FLAGS said), on the CPU, before JAX
starts anywhere."""

import atexit
import os
import shutil
import tempfile

from jaxpar import configfile

configfile.set_host_device_count(8, replace=True)
configfile.cpu_only()

# One XLA compilation cache for the session (and the CLI subprocesses it starts): schedules that
# differ only in event order compile identical stage programs, and runs repeat references.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # ours: removed when the session ends
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxpar-xla-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
