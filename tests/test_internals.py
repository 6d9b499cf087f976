"""JAX's internals in one module (jaxpar/jax_internals.py): every internal resolves on the
pinned JAX, a moved one fails in one line naming it."""

import glob
import os
import re
import socket
import subprocess
import sys
import textwrap

import jax
import jaxlib
import pytest

from jaxpar import configfile, jax_internals
from tests.util import ROOT, cli_env, one_error_line

# -- the internals --------------------------------------------------------------------------


def test_every_internal_resolves_on_the_pinned_jax():
    """The JAX installed is the one requirements.txt pins and the module was written for, and
    everything the module reads from it is there."""
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        pins = dict(re.findall(r"^(jax|jaxlib)==(\S+)", f.read(), re.MULTILINE))
    assert pins == {"jax": jax_internals.WRITTEN_FOR, "jaxlib": jax_internals.WRITTEN_FOR}
    assert jax.__version__ == jax_internals.WRITTEN_FOR
    jax_internals.check()
    for path in jax_internals.INTERNALS:  # functions and methods; the client before joining
        found = jax_internals.resolve(path)
        assert found is None if path.endswith(".client") else callable(found), path
    for name in jax_internals.OPTIONS:
        assert name in jax.config.values, name
    jax.devices()  # the backends start (8 simulated CPU devices, tests/conftest.py) ...
    assert jax_internals.backends_started()
    with pytest.raises(RuntimeError, match="already runs with 8 device"):  # ... and it is seen
        configfile.set_host_device_count(4, replace=True)
    with pytest.raises(RuntimeError, match="initialize has not been called"):
        jax_internals.Coordination()  # this process has not joined a cluster
    # The key JAX's preemption sync manager sets is a name in jaxlib's C++ library.
    key = jax_internals.PREEMPTION_NOTICE_KEY.encode()
    libraries = glob.glob(os.path.join(os.path.dirname(jaxlib.__file__), "*.so"))
    assert libraries
    assert any(_contains(path, key) for path in libraries), key


def _contains(path: str, needle: bytes) -> bool:
    with open(path, "rb") as f:
        tail = b""
        while chunk := f.read(1 << 24):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
    return False


def _one_line(error: Exception) -> str:
    text = str(error)
    assert "\n" not in text and text.endswith("or port jaxpar/jax_internals.py to this JAX")
    assert f"jax=={jax_internals.WRITTEN_FOR} jaxlib=={jax_internals.WRITTEN_FOR}" in text
    return text


def test_a_moved_internal_fails_in_one_line_naming_it(monkeypatch):
    from jax._src import xla_bridge

    monkeypatch.delattr(xla_bridge, "backends_are_initialized")
    with pytest.raises(jax_internals.JaxInternalsError) as caught:
        jax_internals.check()
    assert _one_line(caught.value).startswith(
        "JAX 0.10.2 has no jax._src.xla_bridge.backends_are_initialized, which jaxpar uses to "
        "know whether JAX's backends started: install"
    )
    # The accessor says the same where it is used, past callers that catch ImportError,
    # AttributeError and RuntimeError (the simulated device count could silently be ignored).
    with pytest.raises(jax_internals.JaxInternalsError, match="backends_are_initialized"):
        configfile.set_host_device_count(8, replace=True)

    # An upgrade: the version jaxpar was written for is named, and everything that moved.
    monkeypatch.setattr(jax, "__version__", "0.99.0")
    monkeypatch.setitem(sys.modules, "jax._src.distributed", None)  # the module is gone
    monkeypatch.delattr(jax._src, "distributed")
    values = {k: v for k, v in jax.config.values.items() if k != "jax_enable_recoverability"}
    monkeypatch.setattr(type(jax.config), "values", property(lambda self: values))
    with pytest.raises(jax_internals.JaxInternalsError) as caught:
        jax_internals.check()
    assert _one_line(caught.value).startswith(
        "JAX 0.99.0 (jaxpar is written for JAX 0.10.2) has no "
        "jax._src.xla_bridge.backends_are_initialized, jax._src.distributed.global_state.client, "
        "jax.config option jax_enable_recoverability, which jaxpar uses (see "
        "jaxpar/jax_internals.py for what each is for): install"
    )
    with pytest.raises(jax_internals.JaxInternalsError, match="option jax_enable_recoverab"):
        jax_internals.set_option("jax_enable_recoverability", True)


def test_a_client_without_a_call_fails_in_one_line(monkeypatch):
    """The coordination service's client lost a method jaxpar calls (a fake client stands in
    for a joined process's)."""
    from jax._src import distributed

    class Client:
        def get_live_nodes(self, processes):
            return {p: 0 for p in processes}

        def wait_at_barrier(self, name, timeout_ms):
            pass

    monkeypatch.setattr(distributed.global_state, "client", Client())
    with pytest.raises(jax_internals.JaxInternalsError) as caught:
        jax_internals.Coordination()
    assert _one_line(caught.value).startswith(
        "JAX 0.10.2 has no jax._src.lib._jax.DistributedRuntimeClient.key_value_try_get, which "
        "jaxpar uses to read the preemption notice"
    )


@pytest.mark.slow
def test_the_cli_fails_in_one_line_when_an_internal_moved():
    """`python -m jaxpar.train` of a multi-process run under a JAX without one internal:
    one line, exit 1, before joining (nothing listens on the port)."""
    script = textwrap.dedent("""
        import runpy, sys
        import jax._src.lib as lib
        del lib._jax.DistributedRuntimeClient.wait_at_barrier
        sys.argv = ["jaxpar.train", *sys.argv[1:]]
        runpy.run_module("jaxpar.train", run_name="__main__")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script, "--config", "configs/vgg19_hybrid.py",
         f"--coordinator=127.0.0.1:{_free_port()}", "--num_processes=2", "--process_id=0"],
        cwd=ROOT, env=cli_env({"JAX_PLATFORMS": "cpu"}), capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    line = one_error_line(proc, 1)
    assert "has no jax._src.lib._jax.DistributedRuntimeClient.wait_at_barrier" in line


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
