"""Test set-up: eight simulated CPU devices (whatever XLA_FLAGS said), on the CPU, before JAX
starts anywhere."""

import os
import tempfile

from jaxpar import configfile

configfile.set_host_device_count(8, replace=True)
configfile.cpu_only()

# One XLA compilation cache for the session (and the CLI subprocesses it starts): schedules that
# differ only in event order compile identical stage programs, and runs repeat references.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="jaxpar-xla-cache-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
