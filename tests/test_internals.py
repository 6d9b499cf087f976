"""JAX's internals in one module (jaxpar/jax_internals.py), and where a multi-process run
listens: every internal resolves on the pinned JAX, a moved one fails in one line naming it;
a run on one machine listens on loopback only (the coordination service and gloo), a run
told where to bind binds there. Every address used here is a loopback one."""

import glob
import importlib.util
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jaxlib
import pytest

from jaxpar import cluster, configfile, jax_internals
from tests.util import ROOT, TINY, cli_env, flags, free_port, one_error_line, run_cli

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


def test_gloo_without_a_host_name_fails_in_one_line(monkeypatch):
    """jaxlib's gloo constructor lost its `hostname` argument: jaxpar could not keep gloo on
    loopback, and says so before joining."""
    from jax._src.lib import _jax

    def make_gloo_tcp_collectives(distributed_client):
        """make_gloo_tcp_collectives(distributed_client) -> CpuCollectives"""

    monkeypatch.setattr(_jax, "make_gloo_tcp_collectives", make_gloo_tcp_collectives)
    for call in (jax_internals.check, lambda: jax_internals.gloo_listen_on("127.0.0.1")):
        with pytest.raises(jax_internals.JaxInternalsError) as caught:
            call()
        assert _one_line(caught.value).startswith(
            "JAX 0.10.2 has no jax._src.lib._jax.make_gloo_tcp_collectives(hostname=...), which "
            "jaxpar uses to choose where gloo listens: install"
        )
    assert _jax.make_gloo_tcp_collectives is make_gloo_tcp_collectives  # left as it was


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
        [
            sys.executable,
            "-c",
            script,
            "--config",
            "configs/vgg19_hybrid.py",
            f"--coordinator=127.0.0.1:{free_port()}",
            "--num_processes=2",
            "--process_id=0",
        ],
        cwd=ROOT,
        env=cli_env({"JAX_PLATFORMS": "cpu"}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    line = one_error_line(proc, 1)
    assert "has no jax._src.lib._jax.DistributedRuntimeClient.wait_at_barrier" in line


# -- where a multi-process run listens --------------------------------------------------------


def test_the_coordination_service_binds_to_a_loopback_coordinator_or_where_told(monkeypatch):
    monkeypatch.delenv("JAX_COORDINATOR_BIND_ADDRESS", raising=False)
    for loopback in ("127.0.0.1:1234", "127.0.0.2:1234", "localhost:1234", "[::1]:1234"):
        assert cluster.bind_address(loopback) == loopback
    # Another machine's address (a documentation one, never contacted): JAX's default.
    assert cluster.bind_address("192.0.2.1:1234") is None
    assert cluster.bind_address("host0:1234") is None
    assert cluster.bind_address(None) is None  # JAX reads the cluster (SLURM, ...)
    assert cluster.bind_address("auto") is None
    # The flag wins; JAX's own environment variable wins over the loopback default.
    assert cluster.bind_address("127.0.0.2:1234", "127.0.0.1:1234") == "127.0.0.1:1234"
    assert cluster.bind_address("auto", "[::1]:99") == "[::1]:99"
    monkeypatch.setenv("JAX_COORDINATOR_BIND_ADDRESS", "127.0.0.1:1234")
    assert cluster.bind_address("127.0.0.2:1234") is None


@pytest.mark.parametrize(
    ("coordinator", "bind", "flag", "wrong"),
    [
        ("127.0.0.1:1234", "127.0.0.1", "--coordinator_bind_address", "127.0.0.1"),
        ("127.0.0.1:1234", "127.0.0.1:0", "--coordinator_bind_address", "127.0.0.1:0"),
        ("127.0.0.1:1234", "[::1:99", "--coordinator_bind_address", "[::1:99"),
        ("127.0.0.1", None, "--coordinator", "127.0.0.1"),
        ("127.0.0.1:65536", "127.0.0.1:1", "--coordinator", "127.0.0.1:65536"),
    ],
)
def test_an_address_that_cannot_work_fails_in_one_line(coordinator, bind, flag, wrong):
    with pytest.raises(cluster.ClusterError) as caught:
        cluster.bind_address(coordinator, bind)
    assert str(caught.value) == (
        f"{flag} {wrong!r} is not HOST:PORT with a port in 1..65535 (e.g. 10.0.0.1:12345, "
        "host0:12345, [::1]:12345)"
    )


def test_the_cli_rejects_a_bind_address_in_one_line():
    proc = run_cli(
        "--config",
        "configs/vgg19_hybrid.py",
        "--coordinator=127.0.0.1:1234",
        "--num_processes=2",
        "--process_id=0",
        "--coordinator_bind_address=nonsense",
    )
    line = one_error_line(proc, 2)
    assert line.startswith("error: --coordinator_bind_address 'nonsense' is not HOST:PORT")


def test_the_local_launcher_binds_to_loopback():
    local = _local_launcher()
    commands = local.worker_commands(2, ["--config", "c.py"], 4321)
    for i, cmd in enumerate(commands):
        assert cmd[-4:] == [
            "--coordinator=127.0.0.1:4321",
            "--coordinator_bind_address=127.0.0.1:4321",
            "--num_processes=2",
            f"--process_id={i}",
        ]


def _local_launcher():
    spec = importlib.util.spec_from_file_location("local", os.path.join(ROOT, "launch/local.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on, read from /proc as
    `ss -ltnp` reads it: "::" or "0.0.0.0" is every interface."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
        for row in rows:
            if row[3] != "0A" or row[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = row[1].split(":")
            raw = bytes.fromhex(address)  # 32-bit words in the host's (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(raw)
            ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:127.0.0.1 is 127.0.0.1
            found.add((str(ip), int(port, 16)))
    return found


def _wait_listening(procs, want, timeout=90) -> dict[int, set]:
    """Poll until `want(sockets by process index)` holds; fails if a process ends first."""
    deadline = time.monotonic() + timeout
    while True:
        seen = {i: listening(p.pid) for i, p in enumerate(procs)}
        if want(seen):
            return seen
        ended = [p.pid for p in procs if p.poll() is not None]
        assert not ended and time.monotonic() < deadline, (seen, ended)
        time.sleep(0.2)


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


def _loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


@pytest.mark.slow
def test_process_0_listens_on_the_loopback_coordinator_or_where_told():
    """Process 0 of a run (alone: it starts the service, then waits for process 1, killed
    first): with a loopback coordinator 127.0.0.2 it listens there, not on every interface
    (JAX's default, [::]); with --coordinator_bind_address 127.0.0.1, there."""
    ports = [free_port("127.0.0.2"), free_port("127.0.0.2")]
    binds = [[], [f"--coordinator_bind_address=127.0.0.1:{ports[1]}"]]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jaxpar.train",
                "--config",
                "configs/vgg19_hybrid.py",
                f"--coordinator=127.0.0.2:{port}",
                "--num_processes=2",
                "--process_id=0",
                *bind,
            ],
            cwd=ROOT,
            env=cli_env({"JAX_PLATFORMS": "cpu"}),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port, bind in zip(ports, binds)
    ]
    try:
        seen = _wait_listening(procs, lambda seen: all(seen.values()))
    finally:
        _kill(procs)
    assert seen == {0: {("127.0.0.2", ports[0])}, 1: {("127.0.0.1", ports[1])}}


# Two processes joined as jaxpar joins them, one cross-process collective (gloo); what they
# saw goes to the file argv[3] (not stdout, where gloo's lines are spliced in), then they wait
# while the test reads what they listen on, and leave as a run leaves (cluster.finish).
_JOINED = """
import json, os, sys
from jaxpar import configfile, cluster, jax_internals
configfile.set_host_device_count(2)
cluster.initialize(sys.argv[1], 2, int(sys.argv[2]))
import jax, numpy as np
from jax.experimental import multihost_utils
total = multihost_utils.process_allgather(np.array([jax.process_index() + 1.0]))
coordination = jax_internals.Coordination()
seen = [total.tolist(), sorted(coordination.live_processes([0, 1])),
        coordination.preemption_notice()]
with open(sys.argv[3] + ".tmp", "w") as f:
    json.dump(seen, f)
os.rename(sys.argv[3] + ".tmp", sys.argv[3])
sys.stdin.readline()
cluster.finish()
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_run_on_one_machine_listens_on_loopback_only(tmp_path):
    """Two processes joined at 127.0.0.2 (loopback, but not the address this machine's name
    resolves to, where gloo would listen by default): the coordination service and every gloo
    socket listen on 127.0.0.2 only; the coordination calls of jax_internals work on a live
    cluster, and both leave cleanly."""
    coordinator = f"127.0.0.2:{free_port('127.0.0.2')}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-u", "-c", _JOINED, coordinator, str(i), tmp_path / f"{i}.json"],
            cwd=ROOT,
            env=cli_env({"JAX_PLATFORMS": "cpu"}),
            stdin=subprocess.PIPE,
            stdout=open(tmp_path / f"proc{i}.log", "w"),
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = [tmp_path / f"proc{i}.log" for i in range(2)]
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"{i}.json").exists() for i in range(2)):
            ended = [p.returncode for p in procs if p.poll() is not None]
            assert not ended and time.monotonic() < deadline, [log.read_text() for log in logs]
            time.sleep(0.2)
        seen = {i: listening(p.pid) for i, p in enumerate(procs)}
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        _kill(procs)
    assert codes == [0, 0], [log.read_text() for log in logs]
    for i in range(2):  # the gathered values, the live processes, no preemption notice
        assert json.loads((tmp_path / f"{i}.json").read_text()) == [[[1.0], [2.0]], [0, 1], False]
    port = int(coordinator.rsplit(":", 1)[1])
    assert ("127.0.0.2", port) in seen[0]  # the coordination service
    assert seen[1], seen  # gloo's own sockets in each process
    assert {address for s in seen.values() for address, _ in s} == {"127.0.0.2"}, seen


@pytest.mark.slow
@pytest.mark.multiprocess
def test_launch_local_listens_on_loopback_only(tmp_path):
    """launch/local.py, 2 processes of a tiny run: once process 0's coordination service
    listens (it opens before anything compiles), every socket either process listens on is on
    127.0.0.1. The launcher is then killed by pid (its processes die with it)."""
    launcher = subprocess.Popen(
        [
            sys.executable,
            "launch/local.py",
            "--num_processes",
            "2",
            "--",
            "--config",
            "configs/base.py",
            "--workdir",
            str(tmp_path / "run"),
            *flags(TINY),
        ],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while len(workers := sorted(_children(launcher.pid))) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        with open(f"/proc/{workers[0]}/cmdline") as f:
            (port,) = re.findall(r"--coordinator=127\.0\.0\.1:(\d+)", f.read())
        while True:
            sockets = set().union(*map(listening, workers))
            if int(port) in {p for _, p in sockets}:
                break
            assert launcher.poll() is None and time.monotonic() < deadline, sockets
            time.sleep(0.1)
    finally:
        launcher.kill()
        launcher.wait()
    assert ("127.0.0.1", int(port)) in sockets, sockets  # the coordination service
    assert {address for address, _ in sockets} == {"127.0.0.1"}, sockets


def _children(pid: int) -> set[int]:
    """Live processes whose parent is `pid`."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, parent = f.read().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if int(parent) == pid and state != "Z":
            found.add(int(entry))
    return found
