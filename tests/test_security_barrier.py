"""Security: the start barrier trusts only the session's secret.

Hostile peers: a flood of connections (beyond the server's limits, and until the
process has no file descriptor left), a stranger guessing the wave id with no or
a wrong secret, garbled / huge / non-UTF-8 / deeply nested / cut-short lines;
and where the server listens (loopback when every node is this host, IPv6).
"""

import json
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from milarun.formats import barrier as barrier_mod
from milarun.formats.barrier import REFUSED, BarrierServer, BarrierTimeout, wait
from milarun.host.devices import Devices
from milarun.launcher import suite as suite_mod
from milarun.plan.nodes import Cluster, Node

SECRET = "0123456789abcdef0123456789abcdef"


def _waiters(address, wave, labels, timeout=5, secret=SECRET):
    """Start one thread per label waiting at the barrier; returns (threads, out)."""
    out = {}

    def run(label):
        try:
            out[label] = wait(address, wave, label, timeout, secret=secret)
        except BarrierTimeout as exc:
            out[label] = exc

    threads = [threading.Thread(target=run, args=(label,)) for label in labels]
    for t in threads:
        t.start()
    return threads, out


def _ask(port, line, host="127.0.0.1"):
    """Send ``line`` (bytes), return everything the server answers before closing."""
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(line)
        data = b""
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                return data
            data += chunk


def _request(**fields):
    return (json.dumps(fields) + "\n").encode()


@pytest.fixture
def no_thread_crash(monkeypatch):
    """Fails the test when any thread dies with an exception (a traceback on stderr)."""
    crashes = []
    monkeypatch.setattr(threading, "excepthook", crashes.append)
    yield crashes
    assert crashes == []


# --- strangers -------------------------------------------------------------------------


def test_a_stranger_guessing_the_wave_cannot_release_it(no_thread_crash):
    logged = []
    with BarrierServer(secret=SECRET, log=logged.append) as server:
        server.expect("s.job.J0.w0.20261124-233000", ["0", "1"])
        wave = "s.job.J0.w0.20261124-233000"  # the id a stranger derives from the start second
        threads, out = _waiters(server.address, wave, ["0"])
        deadline = time.monotonic() + 3
        while "0" not in server.state(wave)["arrived"] and time.monotonic() < deadline:
            time.sleep(0.02)
        # the stranger arrives as the missing party, with no, a wrong, a non-string secret
        answers = {
            _ask(server.port, _request(wave=wave, label="1")),
            _ask(server.port, _request(secret="f" * 32, wave=wave, label="1")),
            _ask(server.port, _request(secret=["x"], wave=wave, label="1")),
            _ask(server.port, _request(secret=SECRET[:-1] + "\ud800", wave=wave, label="1")),
        }
        # ...and cannot tell a right guess from a wrong one: one constant answer
        answers |= {
            _ask(server.port, _request(secret="f" * 32, wave="nope", label="1")),
            _ask(server.port, _request(secret="f" * 32, wave=wave, label="9")),
        }
        assert answers == {(json.dumps(REFUSED) + "\n").encode()}
        time.sleep(0.3)
        assert server.state(wave)["released"] is None and list(server.state(wave)["arrived"]) == [
            "0"
        ]
        assert threads[0].is_alive() and "0" not in out  # the real party still waits
        assert server.strangers == 6 and server.stranger_peers == ["127.0.0.1"]
        # a second connection for a label already waiting is refused too (one per label)
        with pytest.raises(BarrierTimeout, match="refused this process"):
            wait(server.address, wave, "0", 2, secret=SECRET)
        assert threads[0].is_alive()
        late, late_out = _waiters(server.address, wave, ["1"])
        for t in threads + late:
            t.join()
    out.update(late_out)
    assert out["0"]["arrived_count"] == out["1"]["arrived_count"] == 2
    assert out["0"]["server_release"] == out["1"]["server_release"]
    assert logged == []  # strangers are counted, never logged one by one


def test_authenticated_unknown_wave_and_label_get_the_same_answer():
    with BarrierServer(secret=SECRET) as server:
        server.expect("w", ["0"])
        wrong_wave = _ask(server.port, _request(secret=SECRET, wave="v", label="0"))
        wrong_label = _ask(server.port, _request(secret=SECRET, wave="w", label="7"))
        assert wrong_wave == wrong_label == (json.dumps(REFUSED) + "\n").encode()
        assert server.strangers == 0  # they had the secret: processes of this session


@pytest.mark.parametrize(
    "line",
    [
        b"\xff\xfe\xfd\n",  # not UTF-8
        b'{"secret": "' + b"a" * 100_000 + b'"}\n',  # huge
        b"[" * 3000 + b"\n",  # nested past the recursion limit
        b"{" * 3000 + b"\n",
        b'{"secret": "\xff", "wave": "w", "label": "0"}\n',  # a non-UTF-8 secret
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b'{"wave": "w"',  # cut short, then closed
        b"",  # closed at once
        b"null\n",
        b"[1]\n",
        b'"w"\n',
        b"1e999999\n",
    ],
)
def test_garbled_lines_are_counted_and_never_print_a_traceback(line, capfd, no_thread_crash):
    logged = []
    with BarrierServer(secret=SECRET, log=logged.append) as server:
        server.expect("w", ["0", "1"])
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            try:
                conn.sendall(line)
                conn.shutdown(socket.SHUT_WR)
                conn.recv(4096)
            except OSError:
                pass  # the server may close a huge line before reading it all
        deadline = time.monotonic() + 3
        while server.strangers < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.strangers == 1
        assert server.state("w")["arrived"] == {} and server.state("w")["released"] is None
        threads, out = _waiters(server.address, "w", ["0", "1"])
        for t in threads:
            t.join()
    assert out["0"]["arrived_count"] == out["1"]["arrived_count"] == 2
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err + captured.out and captured.err == ""
    assert logged == []


# --- floods ------------------------------------------------------------------------------


def test_a_flood_beyond_the_limit_does_not_keep_the_wave_out(no_thread_crash):
    with BarrierServer(secret=SECRET, max_pending=4, read_s=30) as server:
        server.expect("w", ["0", "1"])
        flood = [
            socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(60)
        ]  # silent: they hold their slot as long as they may
        try:
            time.sleep(0.3)
            threads, out = _waiters(server.address, "w", ["0", "1"])
            for t in threads:
                t.join()
            assert out["0"]["arrived_count"] == out["1"]["arrived_count"] == 2
            # the oldest silent ones were closed for newer ones; at most 4 still pending
            deadline = time.monotonic() + 3
            while server.strangers < 56 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert server.strangers >= 56
            assert len(server._pending) <= 4
        finally:
            for s in flood:
                s.close()


def test_a_wave_completes_during_a_sustained_flood(no_thread_crash):
    with BarrierServer(secret=SECRET, max_pending=4, read_s=30) as server:
        server.expect("w", ["0", "1"])
        stop = threading.Event()
        opened = []

        def flood():  # silent connections, held open, while the wave sets up and waits
            held = []
            while not stop.is_set():
                if len(held) < 300:
                    try:
                        held.append(socket.create_connection(("127.0.0.1", server.port), timeout=1))
                    except OSError:
                        pass
                else:
                    time.sleep(0.01)
                opened.append(1)
            for s in held:
                s.close()

        flooder = threading.Thread(target=flood)
        flooder.start()
        try:
            while len(opened) < 200:
                time.sleep(0.01)
            threads, out = _waiters(server.address, "w", ["0", "1"], timeout=20)
            for t in threads:
                t.join()
        finally:
            stop.set()
            flooder.join()
    assert out["0"]["arrived_count"] == out["1"]["arrived_count"] == 2, out
    assert server.strangers > 100  # all but the last 4 silent ones were closed


def test_pending_connections_time_out():
    with BarrierServer(secret=SECRET, read_s=0.3) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            conn.sendall(b'{"secret"')  # a byte at a time would not keep it longer either
            t0 = time.monotonic()
            assert conn.recv(4096) == (json.dumps(REFUSED) + "\n").encode()
            assert time.monotonic() - t0 < 2
        assert server.strangers == 1


_EMFILE_SCRIPT = textwrap.dedent("""
    import errno, resource, socket, sys, threading, time
    from milarun.formats.barrier import BarrierServer, wait

    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    logged = []
    server = BarrierServer(secret="s", max_pending=8, log=logged.append).start()
    server.expect("w", ["0", "1"])
    flood = []

    def fill():   # until this process (server included) has no descriptor left
        try:
            while True:
                flood.append(socket.create_connection(("127.0.0.1", server.port), timeout=2))
        except OSError as exc:
            assert exc.errno in (errno.EMFILE, errno.ENFILE), exc

    # A connection must wait in the kernel's queue while no descriptor is left: a socket
    # made before the flood connects without a new descriptor, and accept() has none for
    # it (flooding alone leaves none waiting when the accept thread keeps up). Again if a
    # descriptor came free in between (a pending connection timed out); up to 20 s.
    for _ in range(40):
        if flood:
            flood.pop().close()
        spare = socket.socket()
        fill()
        spare.settimeout(2)
        spare.connect(("127.0.0.1", server.port))
        flood.append(spare)
        for _ in range(10):
            if logged:
                break
            time.sleep(0.05)
        if logged:
            break
    for s in flood:
        s.close()
    out = {}
    def run(label):
        out[label] = wait(server.address, "w", label, 10, secret="s")["arrived_count"]
    threads = [threading.Thread(target=run, args=(label,)) for label in ("0", "1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.close()
    print(len(flood), logged, out)
    sys.exit(0 if out == {"0": 2, "1": 2} and logged else 1)
""")


def test_no_file_descriptor_left_does_not_stop_the_barrier():
    # the issue's `ulimit -n 1024` + 1,100 connections, scaled down to 64
    proc = subprocess.run(
        [sys.executable, "-c", _EMFILE_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Too many open files" in proc.stdout  # the one line the server logged
    assert "Traceback" not in proc.stderr


# --- the secret in the environment, never in a record ---------------------------------


def test_the_secret_reaches_the_child_but_not_its_record_nor_a_rerun():
    from milarun.bench.experiment import rerun_environ
    from milarun.launcher.failures import base_record
    from milarun.plan.launches import plan_job
    from milarun.profile.job import Job

    job = Job(
        "s",
        "crawl",
        "milarun.models.faults:crawl",
        plan_type="per-gpu",
        definition={"partition_scheme": {"type": "per-gpu"}},
    )
    (wave,) = plan_job(
        job,
        Devices("cpu", [0, 1]),
        0,
        "/o",
        use_cgexec=False,
        python="python",
        barrier={"address": "127.0.0.1:4000", "timeout": 60, "secret": SECRET},
    )
    assert wave[0].env["MILARUN_BARRIER_SECRET"] == SECRET
    assert barrier_mod.from_environment(wave[0].env)["secret"] == SECRET
    rec = base_record(wave[0])
    assert "MILARUN_BARRIER_SECRET" not in rec["environ"]
    assert SECRET not in json.dumps(rec)
    assert rec["environ"]["MILARUN_BARRIER"] == "127.0.0.1:4000"
    assert "MILARUN_BARRIER_SECRET" not in rerun_environ(wave[0].env)
    assert "MILARUN_BARRIER_SECRET" not in barrier_mod.without_barrier(wave[0].env)


def test_under_slurm_the_secret_stays_out_of_the_srun_command_line():
    # every user of the node can read a command line (ps); srun --export=ALL passes env
    cluster = _cluster("slurm", ["n0", "n1"])
    argv, env = cluster.on_nodes(
        ["python", "-m", "milarun"],
        {"MILARUN_BARRIER_SECRET": SECRET, "MILARUN_DEVICE": "0"},
        ["n0", "n1"],
    )
    assert argv[0] == "srun" and "--export=ALL" in argv
    assert not [a for a in argv if SECRET in a] and "MILARUN_DEVICE=0" in argv
    assert env == {"MILARUN_BARRIER_SECRET": SECRET}


def test_every_session_draws_its_own_secret():
    a, b = BarrierServer(), BarrierServer()
    try:
        assert len(a.secret) == 32 and a.secret != b.secret
    finally:
        a.close()
        b.close()


def test_the_launcher_reports_the_strangers(capfd):
    cluster = _cluster("local", ["127.0.0.1"])
    with suite_mod.start_barrier(cluster) as server:
        _ask(server.port, _request(wave="x", label="0"))
    err = capfd.readouterr().err
    assert "start barrier refused 1 connection(s) without this session's secret" in err
    assert "127.0.0.1" in err and server.secret not in err


# --- where it listens -------------------------------------------------------------------


def _cluster(kind, addresses):
    nodes = [Node(f"n{i}", address=a, main=i == 0) for i, a in enumerate(addresses)]
    return Cluster(kind, nodes, Devices("cpu", [0]))


@pytest.mark.parametrize("kind", ["slurm", "ssh"])
def test_nodes_all_on_loopback_get_a_loopback_barrier(kind):
    for addresses, connect in (
        (["127.0.0.1", "127.0.0.1"], "127.0.0.1"),
        (["localhost", "localhost"], "localhost"),
        (["127.0.0.1", "localhost"], "127.0.0.1"),
    ):
        cluster = _cluster(kind, addresses)
        assert suite_mod._barrier_host(cluster) == ("127.0.0.1", connect)
        with suite_mod.start_barrier(cluster) as server:
            assert server._sock.getsockname()[0] == "127.0.0.1"  # never 0.0.0.0
            assert server.address == f"{connect}:{server.port}"


def test_a_main_node_given_as_an_ip_address_listens_there_only():
    # another node elsewhere (TEST-NET-1): the server listens on the main node's
    # address, as the children are told, not on every interface
    cluster = _cluster("ssh", ["127.0.0.1", "192.0.2.7"])
    assert suite_mod._barrier_host(cluster) == ("127.0.0.1", "127.0.0.1")


def test_a_main_node_elsewhere_gets_no_barrier():
    assert suite_mod._is_this_host("192.0.2.7") is False
    assert suite_mod._is_this_host("2001:db8::1") is False
    assert suite_mod._is_this_host("no-such-host.invalid") is False
    assert suite_mod._barrier_host(_cluster("ssh", ["192.0.2.7", "127.0.0.1"])) is None


def _no_ipv6():
    if not socket.has_ipv6:
        return "Python was built without IPv6"
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError as exc:
        return f"this kernel has no IPv6 loopback (binding ::1: {exc.strerror or exc})"
    return None


def test_ipv6_and_ipv4_mapped_addresses_are_this_host(monkeypatch):
    assert suite_mod._is_this_host("::ffff:127.0.0.1")
    assert suite_mod._is_this_host("::1")
    real = socket.getaddrinfo

    def fake(host, *args, **kwargs):  # a name that resolves to IPv6 only
        if host == "v6-only.example":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    assert suite_mod._is_this_host("v6-only.example")


@pytest.mark.skipif(_no_ipv6() is not None, reason=str(_no_ipv6()))
def test_an_ipv6_loopback_main_node_gets_a_working_barrier(no_thread_crash):
    cluster = _cluster("ssh", ["::1", "::1"])
    assert suite_mod._barrier_host(cluster) == ("::1", "::1")
    with suite_mod.start_barrier(cluster) as server:
        assert server.address == f"[::1]:{server.port}"
        server.expect("w", ["0", "1"])
        assert (
            _ask(server.port, _request(wave="w", label="0"), host="::1")
            == (json.dumps(REFUSED) + "\n").encode()
        )
        threads, out = _waiters(server.address, "w", ["0", "1"], secret=server.secret)
        for t in threads:
            t.join()
    assert out["0"]["arrived_count"] == out["1"]["arrived_count"] == 2
