"""Synchronized starts (milarun.formats.barrier, bench.sync), own / effective / adjusted throughput
(milarun.measure.throughput) and the multi-process plan type, on CPU."""

import json
import os
import sys
import threading
import time

import pytest

from milarun.analysis.summary import summarize
from milarun.formats import barrier as barrier_mod
from milarun.formats.barrier import BarrierServer, BarrierTimeout, wait
from milarun.formats.jsonfile import load_schema
from milarun.formats.summary import normalize_summary
from milarun.host.devices import Devices
from milarun.launcher.preflight import check_ready
from milarun.launcher.waves import run_wave
from milarun.measure import throughput
from milarun.plan import types as plantypes
from milarun.plan.launches import plan_job
from milarun.plan.nodes import Cluster, Node
from milarun.profile.job import Job
from milarun.report import build_report, render_text

STAMP = "20261122-000000-000000"
#: The barriers' secret here (a session draws its own: secrets.token_hex).
SECRET = "s3cret"


# --- the barrier --------------------------------------------------------------------


def _wait_in_thread(address, wave, label, timeout, delay, out):
    def run():
        time.sleep(delay)
        try:
            out[label] = wait(address, wave, label, timeout, secret=SECRET)
        except BarrierTimeout as exc:
            out[label] = exc

    t = threading.Thread(target=run)
    t.start()
    return t


def test_barrier_releases_the_wave_when_the_last_process_arrives():
    with BarrierServer(secret=SECRET) as server:
        server.expect("w", ["0", "1"])
        out = {}
        address = f"127.0.0.1:{server.port}"
        threads = [
            _wait_in_thread(address, "w", "0", 5, 0.0, out),
            _wait_in_thread(address, "w", "1", 5, 0.4, out),
        ]
        for t in threads:
            t.join()
    first, last = out["0"], out["1"]
    assert first["parties"] == last["parties"] == 2
    assert first["server_release"] == last["server_release"]
    assert first["wait_s"] >= 0.35  # it waited for the late one
    assert last["wait_s"] < 0.3
    skew = throughput.release_skew([first, last])
    assert 0 <= skew < 0.1


def test_barrier_timeout_raises_and_the_giver_up_is_dropped():
    with BarrierServer(secret=SECRET) as server:
        server.expect("w", ["0", "1"])
        address = f"127.0.0.1:{server.port}"
        t0 = time.monotonic()
        with pytest.raises(BarrierTimeout, match="did not reach the start barrier within 0.3 s"):
            wait(address, "w", "0", 0.3, secret=SECRET)
        assert 0.25 < time.monotonic() - t0 < 2
        deadline = time.monotonic() + 3
        while server.state("w")["dropped"] != ["0"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.state("w")["dropped"] == ["0"]
        # the late one is not held by a process that gave up
        assert wait(address, "w", "1", 2, secret=SECRET)["arrived_count"] == 1


def test_a_process_that_ended_before_arriving_is_dropped():
    with BarrierServer(secret=SECRET) as server:
        server.expect("w", ["0", "1", "2"])
        out = {}
        address = f"127.0.0.1:{server.port}"
        threads = [_wait_in_thread(address, "w", label, 5, 0.0, out) for label in ("0", "1")]
        time.sleep(0.3)
        assert not out
        server.drop("w", "2")
        for t in threads:
            t.join()
    assert out["0"]["arrived_count"] == out["1"]["arrived_count"] == 2


def test_unknown_wave_and_unreachable_server_fail_as_barrier_timeouts():
    with BarrierServer(secret=SECRET) as server:
        with pytest.raises(BarrierTimeout, match="refused this process: unknown wave"):
            wait(f"127.0.0.1:{server.port}", "nope", "0", 2, secret=SECRET)
        port = server.port
    with pytest.raises(BarrierTimeout, match="cannot reach the start barrier"):
        wait(f"127.0.0.1:{port}", "w", "0", 0.3, secret=SECRET)
    assert BarrierTimeout.fail_reason == "barrier-timeout"


def test_stray_requests_get_an_error_line_and_no_thread_traceback(monkeypatch):
    import socket

    crashes = []
    monkeypatch.setattr(threading, "excepthook", crashes.append)
    with BarrierServer(secret=SECRET) as server:
        server.expect("w", ["0", "1"])
        for line in (
            b'{"wave": [1], "label": "0"}\n',
            b'{"wave": "w", "label": {"a": 1}}\n',
            b'{"wave": "w", "label": 0}\n',
            b"\xff\xfe\n",
            b"[1]\n",
            b"GET / HTTP/1.0\r\n\r\n",
        ):
            with socket.create_connection(("127.0.0.1", server.port), timeout=2) as conn:
                conn.sendall(line)
                conn.recv(200)  # the error line, or the server closing a garbled request
        time.sleep(0.2)
        assert server.state("w") == {
            "labels": ["0", "1"],
            "arrived": {},
            "dropped": [],
            "released": None,
        }
        # the wave still releases its own processes
        out = {}
        address = f"127.0.0.1:{server.port}"
        for t in [_wait_in_thread(address, "w", label, 5, 0.0, out) for label in ("0", "1")]:
            t.join()
    assert crashes == []
    assert out["0"]["arrived_count"] == out["1"]["arrived_count"] == 2


def test_barrier_timeout_from_the_environment_must_be_finite():
    env = {"MILARUN_BARRIER": "127.0.0.1:4000", "MILARUN_BARRIER_WAVE": "w"}
    for bad in ("inf", "nan", "-1", "0", "soon"):
        with pytest.raises(ValueError, match="MILARUN_BARRIER_TIMEOUT"):
            barrier_mod.from_environment({**env, "MILARUN_BARRIER_TIMEOUT": bad})
    # a huge finite timeout neither overflows the socket's timeout nor waits for nothing
    with BarrierServer(secret=SECRET) as server:
        server.expect("w", ["0"])
        assert wait(f"127.0.0.1:{server.port}", "w", "0", 1e300, secret=SECRET)["parties"] == 1


def test_environment_of_a_process_launched_alone_has_no_barrier():
    assert barrier_mod.from_environment({}) is None
    env = {
        "MILARUN_BARRIER": "10.0.0.1:4000",
        "MILARUN_BARRIER_WAVE": "w",
        "MILARUN_BARRIER_TIMEOUT": "7",
        "MILARUN_DEVICE": "1",
    }
    assert barrier_mod.from_environment(env) == {
        "address": "10.0.0.1:4000",
        "wave": "w",
        "label": "1",
        "timeout": 7.0,
        "secret": "",
    }
    with pytest.raises(ValueError):
        barrier_mod.from_environment({"MILARUN_BARRIER": "nohost"})


def test_a_process_launched_alone_does_not_wait(monkeypatch):
    from milarun.bench.experiment import Experiment, rerun_environ
    from milarun.bench.sync import synchronize

    exp = Experiment("t.job")
    assert synchronize(exp, environ={}) is None
    assert "barrier" not in exp.result["timings"]
    # a rerun runs alone: the session's barrier is not replayed
    assert rerun_environ(
        {"MILARUN_BARRIER": "x:1", "MILARUN_BARRIER_WAVE": "w", "MILARUN_DEVICE": "0"}
    ) == {"MILARUN_DEVICE": "0"}


def test_synchronize_records_the_release(monkeypatch):
    from milarun.bench.experiment import Experiment
    from milarun.bench.sync import synchronize

    with BarrierServer(secret=SECRET) as server:
        server.expect("w", ["0"])
        exp = Experiment("t.job")
        env = {
            "MILARUN_BARRIER": f"127.0.0.1:{server.port}",
            "MILARUN_BARRIER_WAVE": "w",
            "MILARUN_DEVICE": "0",
            "MILARUN_BARRIER_TIMEOUT": "5",
            "MILARUN_BARRIER_SECRET": SECRET,
        }
        info = synchronize(exp, environ=env)
    bar = exp.result["timings"]["barrier"]
    assert bar is info and bar["parties"] == 1 and bar["released"] >= bar["arrived"]
    assert 0 < bar["released_at"] < 60
    # the samples' zero on the server's clock
    assert throughput.anchor(exp.result) == pytest.approx(
        bar["server_release"] - bar["released_at"]
    )


def test_torchrun_ranks_meet_after_rank_0_met_the_wave(monkeypatch):
    import torch.distributed as dist

    from milarun.bench.experiment import Experiment
    from milarun.bench.sync import synchronize

    calls = []
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda: calls.append("barrier"))
    with BarrierServer(secret=SECRET) as server:
        server.expect("w", ["node1.all"])
        env = {
            "MILARUN_BARRIER": f"127.0.0.1:{server.port}",
            "MILARUN_BARRIER_WAVE": "w",
            "MILARUN_DEVICE": "node1.all",
            "MILARUN_BARRIER_TIMEOUT": "5",
            "MILARUN_BARRIER_SECRET": SECRET,
            "WORLD_SIZE": "2",
        }
        rank0 = Experiment("t.job")
        assert synchronize(rank0, environ={**env, "RANK": "0"})["parties"] == 1
        assert calls == ["barrier"]
        rank1 = Experiment("t.job")  # never connects: only rank 0 speaks for its launch
        info = synchronize(rank1, environ={**env, "RANK": "1", "MILARUN_BARRIER_WAVE": "unknown"})
        assert "server_release" not in info and calls == ["barrier", "barrier"]


# --- own / effective / adjusted throughput -------------------------------------------


def windows(start, end, rate, warmup=2, length=1.0):
    """Consecutive 1 s samples from ``start`` to ``end`` at ``rate`` (a number or
    ``f(t)``), the first ``warmup`` flagged."""
    out, t = [], start
    while t < end - 1e-9:
        r = rate(t) if callable(rate) else rate
        out.append(
            {
                "start": t,
                "end": t + length,
                "count": r * length,
                "rate": r,
                "warmup": len(out) < warmup,
            }
        )
        t += length
    return out


def test_work_in_counts_a_straddling_window_pro_rata():
    s = [
        {"start": 0.0, "end": 1.0, "count": 10.0, "rate": 10.0, "warmup": False},
        {"start": 1.0, "end": 2.0, "count": 20.0, "rate": 20.0, "warmup": False},
    ]
    assert throughput.work_in(s, 0.5, 2.0) == pytest.approx(25.0)
    assert throughput.work_in(s, 3.0, 4.0) == 0


def test_full_overlap_effective_is_the_rate_and_adjusted_the_sum():
    a = {"label": "0", "anchor": 1000.0, "samples": windows(0, 20, 100.0)}
    b = {"label": "1", "anchor": 1000.0, "samples": windows(0, 20, 50.0)}
    w = throughput.wave([a, b])
    assert w["interval"] == [1002.0, 1019.0]  # after warm-up, before the last second
    assert w["overlap"] == pytest.approx(1.0) and not w["flagged"]
    assert w["effective"] == pytest.approx({"0": 100.0, "1": 50.0})
    assert w["own"] == pytest.approx({"0": 100.0, "1": 50.0})
    assert w["adjusted"] == pytest.approx(150.0)


def test_non_overlapping_steady_states_have_no_effective_throughput():
    a = {"label": "0", "anchor": 1000.0, "samples": windows(0, 20, 100.0)}
    b = {"label": "1", "anchor": 1100.0, "samples": windows(0, 20, 100.0)}
    w = throughput.wave([a, b])
    assert w["interval"] is None and w["overlap"] == 0 and w["flagged"]
    assert w["effective"] == {"0": None, "1": None} and w["adjusted"] is None
    assert w["own"] == pytest.approx({"0": 100.0, "1": 100.0})


def test_partial_overlap_is_flagged_and_own_overstates_a_process_left_alone():
    # "1" finishes at 16 s; "0" is slow (100/s) while both run, fast (200/s) alone.
    a = {
        "label": "0",
        "anchor": 1000.0,
        "samples": windows(0, 30, lambda t: 100 if t < 15 else 200),
    }
    b = {"label": "1", "anchor": 1000.0, "samples": windows(0, 16, 100.0)}
    w = throughput.wave([a, b])
    assert w["interval"] == [1002.0, 1015.0]
    assert w["overlap"] == pytest.approx(13 / 27) and w["flagged"]
    assert w["own"]["0"] == pytest.approx(200.0)  # its last 10 s, alone
    assert w["effective"]["0"] == pytest.approx(100.0)  # under the test's load
    assert w["adjusted"] == pytest.approx(200.0)


def test_anchor_prefers_the_barrier_then_origin_then_start():
    rec = {
        "timings": {
            "program": {"start": 50.0, "origin": 48.0},
            "barrier": {"server_release": 100.0, "released_at": 3.0},
        }
    }
    assert throughput.anchor(rec) == 97.0
    del rec["timings"]["barrier"]
    assert throughput.anchor(rec) == 48.0
    del rec["timings"]["program"]["origin"]
    assert throughput.anchor(rec) == 50.0


def record(device, run, start, samples, released=None):
    from milarun.formats.record import new_result

    rec = new_result(
        "s.t", f"{run}.{device}", device=device, devices=[int(device)], run=run, plan_type="per-gpu"
    )
    rec["success"] = True
    rec["timings"]["program"] = {"start": start, "end": start + 30, "duration": 30.0}
    rec["timings"]["train"]["samples"] = samples
    if released is not None:
        rec["timings"]["barrier"] = {
            "released": released,
            "server_release": start + 1,
            "released_at": 1.0,
        }
    return rec


def test_summary_and_report_use_effective_and_keep_the_2020_rule_with_own():
    fast = lambda t: 100 if t < 15 else 200  # noqa: E731
    recs = [
        record("0", 0, 1000.0, windows(0, 30, fast), released=1001.000),
        record("1", 0, 1000.0, windows(0, 16, 100.0), released=1001.002),
    ]
    summary = normalize_summary(json.loads(json.dumps(summarize(recs))))
    t = summary["tests"]["s.t"]
    assert t["train"]["mean"] == pytest.approx(150.0)  # own: 200 and 100
    assert t["effective"]["mean"] == pytest.approx(100.0)  # both 100 under load
    assert t["adjusted"]["mean"] == pytest.approx(200.0)
    assert t["overlap"] == pytest.approx(13 / 27)
    assert t["sync"] == {"waves": 1, "synchronized": 2, "skew_s": pytest.approx(0.002)}
    rep = build_report(summary)
    row = rep.rows[0]
    assert row["basis"] == "effective" and row["perf"] == pytest.approx(100.0)
    assert row["own"] == pytest.approx(150.0) and "own" in rep.columns
    assert rep.overlap == [("s.t", pytest.approx(13 / 27))]
    text = render_text(rep)
    assert "overlap by less than 80% of their length: s.t (48%)" in text
    assert "adjusted throughput 200.00 items/s" in text and "start skew 2.0 ms" in text
    from milarun.report import render_html

    page = render_html(rep)
    assert 'id="overlap"' in page and 'id="concurrent-s.t"' in page
    assert "<th>own</th>" in page and "adjusted throughput 200.00 items/s" in page
    legacy = build_report(summary, throughput="own")
    assert legacy.rows[0]["perf"] == pytest.approx(150.0)
    assert legacy.rows[0]["std"] == pytest.approx((50 * 2**0.5) / 150)
    assert "own" not in legacy.columns


def test_2020_baseline_scores_are_the_same_under_both_rules():
    from pathlib import Path

    from milarun.formats.summary import read_summary

    base = read_summary(Path(__file__).parent / "fixtures" / "baseline2020.json")
    a, b = build_report(base), build_report(base, throughput="own")
    assert a.score == b.score and a.score is not None
    assert [r["perf_adj"] for r in a.rows] == [r["perf_adj"] for r in b.rows]
    from milarun.errors import MilarunError

    with pytest.raises(MilarunError, match="--throughput must be effective or own"):
        build_report(base, throughput="mean")


# --- the multi-process plan type ------------------------------------------------------


def mp_job(processes=2, k=None, experiment="milarun.models.infer:main", arguments=None):
    scheme = {"type": "multi-process", "processes": processes}
    if k:
        scheme["devices_per_process"] = k
    return Job(
        "s",
        "infer",
        experiment,
        arguments=arguments or {"--batch-size": 8},
        plan_type="multi-process",
        definition={"partition_scheme": scheme},
    )


def gpus8():
    node0, node1 = list(range(0, 18)), list(range(18, 36))
    return Devices("gpu", list(range(8)), ["H100"] * 8, [node0] * 4 + [node1] * 4)


def test_schemas_know_every_plan_type():
    result = load_schema("result")["properties"]["partition"]["enum"]
    assert sorted(result) == sorted(plantypes.TYPES)
    test = load_schema("summary")["$defs"]["test"]["properties"]["partition"]["enum"]
    assert sorted(test, key=str) == sorted(list(plantypes.TYPES) + [None], key=str)


def test_two_processes_of_four_gpus_pinned_to_their_numa_nodes(monkeypatch):
    monkeypatch.setattr(plantypes, "launcher_cpus", lambda: list(range(36)))
    (wave,) = plan_job(
        mp_job(),
        gpus8(),
        0,
        "/out",
        "/data",
        python="py",
        barrier={"address": "127.0.0.1:5000", "timeout": 60},
    )
    assert [lch.device for lch in wave] == ["0-3", "4-7"]
    assert [lch.devices for lch in wave] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [lch.env["CUDA_VISIBLE_DEVICES"] for lch in wave] == ["0,1,2,3", "4,5,6,7"]
    assert wave[0].argv[1:3] == ["--localalloc", "--physcpubind=0-17"]
    assert wave[0].argv[0].endswith("numactl") and wave[0].argv[3] == "py"
    assert wave[1].argv[2] == "--physcpubind=18-35"
    assert [lch.env["MILARUN_CPUS"] for lch in wave] == ["0-17", "18-35"]
    assert all(lch.concurrent and lch.cgroup is None for lch in wave)
    assert {lch.env["MILARUN_BARRIER_WAVE"] for lch in wave} == {wave[0].barrier_wave}
    assert wave[0].env["MILARUN_BARRIER"] == "127.0.0.1:5000"
    assert wave[0].env["MILARUN_BARRIER_TIMEOUT"] == "60"
    assert "synchronized start" in wave[0].describe()


def test_processes_sharing_a_numa_node_split_its_cores(monkeypatch):
    monkeypatch.setattr(plantypes, "launcher_cpus", lambda: list(range(36)))
    (wave,) = plan_job(mp_job(4), gpus8(), 0, "/out", python="py")
    assert [lch.device for lch in wave] == ["0-1", "2-3", "4-5", "6-7"]
    assert [lch.env["MILARUN_CPUS"] for lch in wave] == ["0-8", "9-17", "18-26", "27-35"]
    # no barrier given (tests, --dry-run of old callers): nothing waits
    assert all(lch.barrier_wave is None and "MILARUN_BARRIER" not in lch.env for lch in wave)


def test_multi_process_on_cpu_slots_and_fewer_devices(monkeypatch):
    monkeypatch.setattr(plantypes, "launcher_cpus", lambda: [0, 1, 2, 3])
    job = mp_job(2)
    (wave,) = plan_job(job, Devices("cpu", [0, 1, 2, 3]), 0, "/out", python="py")
    assert [(lch.device, lch.env["MILARUN_CPUS"]) for lch in wave] == [
        ("0-1", "0-1"),
        ("2-3", "2-3"),
    ]
    # one device: one process, which never waits; the operator is told
    cluster = Cluster("local", [Node("h", "127.0.0.1", main=True)], Devices("cpu", [0]))
    (alone,) = plan_job(
        job, cluster, 0, "/out", python="py", barrier={"address": "127.0.0.1:1", "timeout": 5}
    )
    assert len(alone) == 1 and alone[0].barrier_wave is None
    assert plantypes.TYPES["multi-process"].notes(job, cluster) == [
        "multi-process: 2 processes asked; this node's 1 device(s) give 1 process(es) x 1 device(s)"
    ]
    # --no-cgexec: no pinning
    (free,) = plan_job(job, Devices("cpu", [0, 1]), 0, "/out", python="py", use_cgexec=False)
    assert all(lch.cpus is None and "numactl" not in " ".join(lch.argv) for lch in free)


def test_process_cpus_without_affinity_splits_the_host():
    from milarun.host.isolation import process_cpus

    assert process_cpus([[0], [1]], [[], []], [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError):
        process_cpus([[0], [1]], [[], []], [0])


def test_check_ready_wants_numactl_for_pinned_launches(monkeypatch):
    from milarun.errors import SetupError

    monkeypatch.setattr(plantypes, "launcher_cpus", lambda: [0, 1])
    waves = plan_job(mp_job(), Devices("cpu", [0, 1]), 0, "/out", python="py")
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(SetupError, match="numactl is not installed"):
        check_ready(waves)


def test_rerun_of_a_launchers_fail_record_does_not_wait_at_the_old_barrier(monkeypatch):
    # a child killed before writing its record leaves the launcher's FAIL record, whose
    # environ is the launch's: the rerun must not wait 600 s at a long-gone barrier
    from milarun.launcher.failures import base_record
    from milarun.launcher.rerun import rerun_command

    monkeypatch.setenv("MILARUN_BARRIER", "127.0.0.1:9")  # leaked into the user's shell
    (wave,) = plan_job(
        crawl_job(),
        Devices("cpu", [0, 1]),
        0,
        "/o",
        use_cgexec=False,
        python="python",
        barrier={"address": "127.0.0.1:4000", "timeout": 60},
    )
    rec = base_record(wave[0])
    assert rec["environ"]["MILARUN_BARRIER"] == "127.0.0.1:4000"  # what the launch had
    _, env = rerun_command(rec, python="python")
    assert not [k for k in env if k.startswith("MILARUN_BARRIER")]
    assert env["MILARUN_DEVICE"] == "0"
    assert barrier_mod.from_environment(env) is None


def test_barrier_timeout_bounds():
    from milarun.errors import SetupError
    from milarun.launcher.bounds import check_bounds

    check_bounds(1, None, None, None, 30.0)
    for bad in (0.0, -1.0, float("nan"), 1e9):
        with pytest.raises(SetupError, match="--barrier-timeout must be a number of seconds"):
            check_bounds(1, None, None, None, bad)


# --- end to end: waves of real processes ----------------------------------------------


def crawl_job():
    return Job(
        "s",
        "crawl",
        "milarun.models.faults:crawl",
        arguments={
            "--step-seconds": 0.01,
            "--max-count": 120,
            "--sample-duration": 0.1,
            "--warmup": 2,
        },
        plan_type="per-gpu",
        definition={"partition_scheme": {"type": "per-gpu"}},
    )


def test_two_processes_start_their_timed_loops_together(tmp_path):
    with BarrierServer(secret=SECRET) as server:
        (wave,) = plan_job(
            crawl_job(),
            Devices("cpu", [0, 1]),
            0,
            tmp_path,
            use_cgexec=False,
            python=sys.executable,
            barrier={"address": server.address, "secret": SECRET, "timeout": 60},
        )
        # a slow set-up on one device; 3 s so a busy host's start-up delay of the
        # fast one (seen at 0.5 s in a loaded run) cannot erase the difference
        wave[1].argv += ["--setup", "3.0"]
        outcomes = run_wave(wave, tmp_path, barrier=server)
    assert [o.success for o in outcomes] == [True, True]
    recs = [json.loads(o.result_path.read_text()) for o in outcomes]
    bars = [r["timings"]["barrier"] for r in recs]
    assert [b["parties"] for b in bars] == [2, 2]
    assert bars[0]["wait_s"] > 1.0 > bars[1]["wait_s"]  # the fast one waited
    # loose bounds (a busy CI host): without the barrier they would be 3 s apart
    assert throughput.release_skew(bars) < 0.5
    # the first windows open together on the common clock, despite 3 s of set-up
    starts = [throughput.anchor(r) + r["timings"]["train"]["samples"][0]["start"] for r in recs]
    assert abs(starts[0] - starts[1]) < 0.5
    t = summarize(recs)["tests"]["s.crawl"]
    assert t["sync"]["synchronized"] == 2 and t["sync"]["skew_s"] < 0.5
    assert t["overlap"] > 0.5 and t["effective"]["n"] == 2


def test_a_process_stuck_in_set_up_fails_the_others_with_barrier_timeout(tmp_path):
    with BarrierServer(secret=SECRET) as server:
        (wave,) = plan_job(
            crawl_job(),
            Devices("cpu", [0, 1]),
            0,
            tmp_path,
            use_cgexec=False,
            python=sys.executable,
            barrier={"address": server.address, "secret": SECRET, "timeout": 0.5},
        )
        wave[1].argv += ["--setup", "3"]
        outcomes = run_wave(wave, tmp_path, barrier=server)
    first, late = outcomes
    assert not first.success and first.reason == "barrier-timeout"
    rec = json.loads(first.result_path.read_text())
    assert rec["error"]["reason"] == "barrier-timeout"
    assert rec["timings"]["barrier"]["released"] is None
    assert "did not reach the start barrier within 0.5 s" in rec["error"]["message"]
    # the one that gave up does not hold the late one
    assert late.success


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_multi_process_inference_on_cpu_slots_pinned_and_synchronized(tmp_path):
    import shutil

    if shutil.which("numactl") is None:
        pytest.skip("numactl not installed")
    cores = sorted(os.sched_getaffinity(0))[:2]
    job = mp_job(
        2,
        arguments={
            "--model": "resnet18",
            "--synthetic": True,
            "--batch-size": 2,
            "--image-size": 32,
            "--max-count": 120,
            "--warmup": 2,
            "--sample-duration": 0.2,
            "--device": "cpu",
        },
    )
    with BarrierServer(secret=SECRET) as server:
        devs = Devices("cpu", [0, 1])
        (wave,) = plan_job(
            job,
            devs,
            0,
            tmp_path,
            python=sys.executable,
            barrier={"address": server.address, "secret": SECRET, "timeout": 120},
        )
        check_ready([wave])
        outcomes = run_wave(wave, tmp_path, barrier=server)
    assert [o.success for o in outcomes] == [True, True], [o.reason for o in outcomes]
    recs = [json.loads(o.result_path.read_text()) for o in outcomes]
    # pinning is visible in the records: one core each, as numactl was told
    assert [r["host"]["cpuset"] for r in recs] == [[cores[0]], [cores[1]]]
    assert [r["environ"]["MILARUN_CPUS"] for r in recs] == [str(cores[0]), str(cores[1])]
    assert all(
        r["partition"] == "multi-process" and r["metrics"]["items_device0"] > 0 for r in recs
    )
    t = summarize(recs)["tests"]["s.infer"]
    assert t["sync"]["synchronized"] == 2
    if t["effective"]["n"] == 2:  # steady states overlapped (they start together)
        assert t["adjusted"]["mean"] == pytest.approx(
            sum(v["mean"] for v in t["pergpu_effective"].values())
        )
    assert t["overlap"] is not None


# --- the inference workload -------------------------------------------------------------


class _FakeCuda:
    """Enough of ``torch.cuda`` for :class:`milarun.models.infer.Workers` (no GPU here)."""

    def __init__(self, log):
        self.log = log

    def set_device(self, device):
        self.log.append(("set_device", threading.current_thread().name, str(device)))

    def Stream(self, device):
        log = self.log

        class Stream:
            def synchronize(self):
                log.append(("synchronize", str(device)))

            def wait_event(self, event):
                log.append(("wait_event", str(device)))

        return Stream()

    def Event(self):
        log = self.log

        class Event:
            def record(self, stream=None):
                pass

            def query(self):
                return False  # never done until waited for: the worker must wait itself

            def synchronize(self):
                log.append(("event.synchronize",))

        return Event()

    def stream(self, s):
        import contextlib

        self.log.append(("stream", id(s)))
        return contextlib.nullcontext()


class _FakeDevice:
    type = "cuda"

    def __init__(self, i):
        self.i = i

    def __str__(self):
        return f"cuda:{self.i}"


class _FakeBatch:
    dtype = "float16"  # cast before pinning, as infer's loader and --synthetic do

    def __init__(self, n, log):
        self.n, self.log = n, log

    def __len__(self):
        return self.n

    def is_floating_point(self):
        return True

    def to(self, device=None, dtype=None, non_blocking=False):
        self.log.append(("to", str(device), dtype, non_blocking))
        return self


class _FakeModel:
    def __init__(self, log):
        self.log = log

    def __deepcopy__(self, memo):  # the replicas share the log
        return type(self)(self.log)

    def to(self, device=None, dtype=None):
        self.device = device
        return self

    def eval(self):
        return self

    def __call__(self, x):
        self.log.append(("infer", str(self.device)))


def test_workers_run_double_buffered_streams_per_gpu_and_count_completed_items(monkeypatch):
    # The CUDA path cannot run on this machine: a fake torch.cuda checks its logic.
    import torch

    from milarun.models.infer import Workers

    log = []
    monkeypatch.setattr(torch, "cuda", _FakeCuda(log))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: log.append(("threads", n)))
    devices = [_FakeDevice(0), _FakeDevice(1)]
    pool = Workers(_FakeModel(log), devices, "float16", inflight=2)
    for _ in range(6):
        pool.submit(_FakeBatch(4, log))
    pool.close()
    assert pool.completed() == 24 and pool.counts == [12, 12]
    assert sorted(e[2] for e in log if e[0] == "set_device") == ["cuda:0", "cuda:1"]
    # no stream is waited for; a batch counts once its done event is (here: always waited for)
    assert not any(e[0] == "synchronize" for e in log)
    assert sum(e[0] == "event.synchronize" for e in log) == 6
    assert sum(e[0] == "wait_event" for e in log) == 6  # compute waits for each copy, on the device
    assert {e[1] for e in log if e[0] == "infer"} == {"cuda:0", "cuda:1"}
    # one non-blocking copy per batch, already in the inference dtype: no cast on the device
    assert [e[2:] for e in log if e[0] == "to"] == [(None, True)] * 6
    assert not any(e[0] == "threads" for e in log)  # intra-op threads are for CPU devices


def test_a_failing_worker_stops_the_main_loop(monkeypatch):
    import torch

    from milarun.models.infer import Workers

    class Broken(_FakeModel):
        def __call__(self, x):
            raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(torch, "cuda", _FakeCuda([]))
    pool = Workers(Broken([]), [_FakeDevice(0)], "float32", inflight=1)
    pool.submit(_FakeBatch(2, []))
    with pytest.raises(RuntimeError, match="inference worker failed"):
        for _ in range(100):
            pool.submit(_FakeBatch(2, []))
            pool.completed()
            time.sleep(0.01)
    pool.close()


def test_infer_encoder_and_images_from_the_loader_on_cpu(tmp_path, tiny_dataroot):
    from conftest import SMOKE_ARGS, build_tiny, run_model

    enc = run_model(
        "milarun.models.infer:main",
        [
            "--model",
            "encoder",
            "--layers",
            "1",
            "--d-model",
            "32",
            "--heads",
            "2",
            "--seq-len",
            "16",
            "--batch-size",
            "4",
            "--max-count",
            "64",
            "--precision",
            "bf16",
            "--device",
            "cpu",
            *SMOKE_ARGS,
        ],
        tmp_path=tmp_path / "enc",
    )
    assert enc["_exit_code"] == 0 and enc["metrics"]["items_device0"] >= 64
    build_tiny(tiny_dataroot, "fake_imagenet")
    img = run_model(
        "milarun.models.infer:main",
        [
            "--model",
            "resnet18",
            "--batch-size",
            "4",
            "--image-size",
            "32",
            "--workers",
            "0",
            "--max-count",
            "32",
            "--device",
            "cpu",
            *SMOKE_ARGS,
        ],
        dataroot=tiny_dataroot,
        tmp_path=tmp_path / "img",
    )
    assert img["_exit_code"] == 0, img["error"]
    assert img["timings"]["train"]["count"] >= 32
    assert "barrier" not in img["timings"]  # launched alone: no wait


def test_a_resumed_half_wave_is_not_mixed_with_the_first_sessions_half():
    # Run 0's device 0 ran in one session; device 1 was relaunched by --resume an hour
    # later. Same run index, different barrier waves: no common wave, own stays.
    a = record("0", 0, 1000.0, windows(0, 20, 100.0), released=1001.0)
    b = record("1", 0, 4600.0, windows(0, 20, 100.0), released=4601.0)
    a["timings"]["barrier"]["wave"] = "s.t.J0.w0.20261122-070000"
    b["timings"]["barrier"]["wave"] = "s.t.J0.w0.20261122-080000"
    assert throughput.summarize_waves([a, b]) == {}
    # Without barrier ids (older records) the run index still makes the wave.
    for r in (a, b):
        del r["timings"]["barrier"]["wave"]
    assert throughput.summarize_waves([a, b])["overlap"] == 0
