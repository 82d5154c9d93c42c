"""Tasks shared with forked workers (milarun.host.forkpool): the values never depend on
the workers (a worker that raises, dies or is slow changes only the time), workers never
outlive the pool, and the report's plots are the same drawn by one process or two."""

import functools
import os
import sys
import threading
import time
import traceback

import pytest

from milarun.host import forkpool
from milarun.host.forkpool import Shared


def in_fork(test):
    """Run the test in a forked copy of this process: pytest's process may hold other
    tests' threads (a pool forks nothing then) and children (which the checks of
    leftover workers would count); the copy has neither."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                test(*args, **kwargs)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, (
            "the test failed in its forked process (its traceback is in the captured stderr)"
        )

    return wrapper


BIG = {i: [float(j) for j in range(50)] for i in range(2000)}  # state the workers read


def _children_of(pid):
    """PIDs of the live (not zombie) children of ``pid``, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry))
    return out


def _no_zombie():
    """True when this process has no child at all (none running, none to reap)."""
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@in_fork
def test_values_in_task_order_and_workers_take_some():
    def run(i):
        time.sleep(0.02)
        return (i, sum(BIG[i]), os.getpid())

    with Shared(30, run, workers=2) as shared:
        values = shared.results()
    assert [v[:2] for v in values] == [(i, sum(BIG[i])) for i in range(30)]
    pids = {v[2] for v in values}
    assert len(pids) == 2, "the worker took no task"
    assert _no_zombie()


@in_fork
def test_one_worker_or_one_task_forks_nothing():
    for count, workers in ((10, 1), (1, 4), (0, 4)):
        with Shared(count, lambda i: (i, os.getpid()), workers=workers) as shared:
            assert shared.children == []
            assert shared.results() == [(i, os.getpid()) for i in range(count)]


@in_fork
def test_no_fork_while_other_threads_run():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        with Shared(8, lambda i: os.getpid(), workers=2) as shared:
            assert shared.children == []
            assert set(shared.results()) == {os.getpid()}
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize("how", ["raises", "dies"])
@in_fork
def test_a_failing_worker_changes_nothing_but_time(how):
    parent = os.getpid()

    def run(i):
        if os.getpid() != parent:
            if how == "raises":
                raise RuntimeError("worker trouble")
            os._exit(3)
        return i * i

    with Shared(12, run, workers=2) as shared:
        assert len(shared.children) == 1
        assert shared.results() == [i * i for i in range(12)]
    assert _no_zombie()


@in_fork
def test_a_task_that_raises_raises_in_the_parent_and_no_worker_is_left():
    def run(i):
        if i == 5:
            raise ValueError("task 5 is bad")
        time.sleep(0.01)
        return i

    with pytest.raises(ValueError, match="task 5 is bad"):
        with Shared(10, run, workers=2) as shared:
            shared.results()
    assert _no_zombie()
    assert _children_of(os.getpid()) == []


@in_fork
def test_leaving_early_kills_the_workers():
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with Shared(4, lambda i: time.sleep(60), workers=3) as shared:
            kids = [pid for pid, _ in shared.children]
            assert len(kids) == 2
            assert set(_children_of(os.getpid())) >= set(kids)
            raise KeyboardInterrupt
    assert time.monotonic() - start < 30, "the workers were waited for, not killed"
    assert _children_of(os.getpid()) == []
    assert _no_zombie()


@in_fork
def test_values_marshal_cannot_write_are_done_by_the_parent():
    # a worker whose values marshal refuses sends nothing; the parent does its tasks
    parent = os.getpid()

    def run(i):
        time.sleep(0.01)
        return object() if os.getpid() != parent else i

    with Shared(10, run, workers=2) as shared:
        assert shared.results() == list(range(10))


def test_usable_cpus_follows_the_affinity_mask():
    assert forkpool.usable_cpus() == len(os.sched_getaffinity(0))


def _generate(directory, **sizes):
    """Result files as benchmarks/report_scale.py makes them."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "report_scale", Path(__file__).resolve().parent.parent / "benchmarks" / "report_scale.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.generate(directory, **sizes)


@in_fork
def test_results_read_with_a_worker_as_one_by_one(tmp_path, monkeypatch):
    """load_results has the schema check done in chunks by a forked worker: the same
    records, the same skipped files and messages, in the same order, as reading each
    file alone (store.parse_results), with bad files spread over several chunks."""
    import json

    from milarun.analysis import summary
    from milarun.formats.store import parse_results, result_files

    parent, mine, pools = os.getpid(), [], []

    marks = tmp_path.parent / f"{tmp_path.name}-taken"
    marks.mkdir()

    class Slow(Shared):
        # the parent holds its first chunk until the worker has taken one
        def __init__(self, count, run, workers=None):
            def slow(i):
                if os.getpid() != parent:
                    (marks / str(i)).touch()
                else:
                    mine.append(i)
                    deadline = time.monotonic() + 60
                    while (
                        len(mine) == 1 and not any(marks.iterdir()) and time.monotonic() < deadline
                    ):
                        time.sleep(0.01)
                return run(i)

            super().__init__(count, slow, 2)
            pools.append(self)

    monkeypatch.setattr(summary, "Shared", Slow)

    assert _generate(tmp_path, tests=3, devices=5, runs=30, nsamples=6) == 450
    names = sorted(p.name for p in tmp_path.iterdir())
    for k, name in enumerate(names[::37]):  # one bad file in most chunks
        path = tmp_path / name
        rec = json.loads(path.read_text())
        if k % 4 == 0:
            rec["run"] = "first"  # the schema refuses it
        elif k % 4 == 1:  # version 0: migrated, not refused
            rec["train"] = rec["timings"].pop("train")
            rec["version"] = 0
        elif k % 4 == 2:
            rec["version"] = 99  # newer than ours
        else:
            path.write_text("{not json")
            continue
        path.write_text(json.dumps(rec))
    expected = list(parse_results(result_files(tmp_path)))
    records, skipped = summary.load_results(tmp_path)
    assert len(skipped) == 10 and len(records) == 440  # 13 bad, 3 of them migrated
    assert [(p, r) for p, r in records] + [(p, str(e)) for p, e in skipped] == [
        (p, r) for p, r in expected if not isinstance(r, Exception)
    ] + [(p, str(r)) for p, r in expected if isinstance(r, Exception)]
    migrated = {tmp_path / names[37 * k] for k in (1, 5, 9)}
    assert [r["version"] for p, r in records if p in migrated] == [1, 1, 1]
    # the worker checked chunks (the parent did not do all 3) and its answers came back
    assert len(pools) == 1 and pools[0].redone == 0 and len(mine) < 3


@in_fork
def test_summary_and_plots_the_same_from_one_process_or_two(tmp_path, monkeypatch):
    """summarize_with's group tasks (summary + plot) give what one process gives, and
    the worker's values come back (none redone: marshal takes every value)."""
    _generate(tmp_path, tests=4, devices=2, runs=2, nsamples=20)

    from milarun.analysis import summary as summ
    from milarun.analysis.summary import load_results, summarize, summarize_with
    from milarun.report.html import throughput_plot, throughput_plots

    pools = []

    class Watched(Shared):
        def results(self):
            forked = len(self.children)
            values = Shared.results(self)
            pools.append((forked, self.redone, values))
            return values

    records, _ = load_results(tmp_path)
    alone, drawn_alone = summarize_with(records, extra=throughput_plot, workers=1)
    monkeypatch.setattr(summ, "Shared", Watched)
    shared, drawn = summarize_with(records, extra=throughput_plot, workers=2)
    assert pools[-1][:2] == (1, 0) and len(pools[-1][2]) == 4
    assert shared == alone == summarize(records)
    assert drawn == drawn_alone
    assert len(drawn) == 4 and all(v[0].startswith("<svg") for v in drawn.values())
    assert {k: v for k, v in throughput_plots(records, workers=2).items()} == drawn


# ---------------------------------------------------------------- review (issue 21 §4)


@in_fork
def test_the_first_failing_task_raises_whoever_took_it():
    """Tasks 0 and 1 both raise; the worker takes 0 while the parent is busy: the
    parent must still raise task 0's error, as one process does (not task 1's)."""

    def run(i):
        raise ValueError(f"task {i}")

    for workers in (1, 2):
        with pytest.raises(ValueError, match="task 0"):
            with Shared(2, run, workers) as shared:
                time.sleep(0.3)  # the worker takes task 0 meanwhile
                shared.results()
    assert _no_zombie()


@in_fork
def test_a_pipe_smaller_than_the_queue_does_not_hang(monkeypatch):
    """A pipe of one page (a user past pipe-user-pages-soft) cannot hold 2,000 tasks:
    the parent does them alone instead of waiting forever to write the queue."""
    import fcntl
    import signal

    real_pipe = os.pipe

    def small_pipe():
        read, write = real_pipe()
        fcntl.fcntl(write, 1031, 4096)  # F_SETPIPE_SZ
        return read, write

    monkeypatch.setattr(forkpool.os, "pipe", small_pipe)

    def hang(*_):
        raise RuntimeError("the queue's write blocked")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(3)
    try:
        with Shared(2000, lambda i: i * 2, 2) as shared:
            assert shared.results() == [i * 2 for i in range(2000)]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert _no_zombie()


@in_fork
def test_an_interrupt_between_two_forks_leaves_no_worker(monkeypatch):
    """Ctrl-C after the first fork, before the second: the worker already forked is
    killed and reaped (the ``with`` block was never entered to do it)."""
    real_pipe, calls = os.pipe, []

    def pipe():
        calls.append(1)
        if len(calls) == 3:  # the queue's, the first worker's, then this one
            raise KeyboardInterrupt
        return real_pipe()

    monkeypatch.setattr(forkpool.os, "pipe", pipe)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(KeyboardInterrupt):
        Shared(10, lambda i: time.sleep(0.05), 3)
    assert _children_of(os.getpid()) == []
    assert _no_zombie()
    assert set(os.listdir("/proc/self/fd")) <= before


@in_fork
def test_a_worker_does_not_run_the_parents_stop_handler(tmp_path):
    """The parent's SIGTERM handler (the launcher's stop request) is not the worker's:
    a worker sent SIGTERM ends; it does not run the handler and go on."""
    import signal

    ran = tmp_path / "ran"

    def handler(*_):
        ran.write_text(str(os.getpid()))

    old = signal.signal(signal.SIGTERM, handler)
    try:
        with Shared(20, lambda i: time.sleep(0.05) or i, 2) as shared:
            time.sleep(0.1)
            pid = shared.children[0][0]
            os.kill(pid, signal.SIGTERM)
            assert shared.results() == list(range(20))
    finally:
        signal.signal(signal.SIGTERM, old)
    assert not ran.exists()
    assert _no_zombie()


def _fixture_records():
    import copy
    import json
    from pathlib import Path

    here = Path(__file__).parent / "fixtures" / "results"
    recs = [json.loads(p.read_text()) for p in sorted(here.glob("standard.convnet.J0.*.json"))]
    a, b = recs[0], copy.deepcopy(recs[1])
    b["host"] = copy.deepcopy(a["host"])
    for gpu in b["host"]["gpus"]:
        gpu["name"] = "OTHER " + gpu["name"]
    return a, b


@pytest.mark.parametrize("workers", [1, 2])
@in_fork
def test_a_host_seen_again_after_another_is_folded_again(workers):
    """Hosts A, B, A (same facts, other GPU names): the last one's names win, as when
    every record was folded (not B's, because A was seen before)."""
    import copy

    from milarun.analysis.summary import summarize_with

    a, b = _fixture_records()
    aba = summarize_with([a, b, copy.deepcopy(a)], workers=workers)[0]["hosts"]
    ba = summarize_with([b, copy.deepcopy(a)], workers=workers)[0]["hosts"]
    assert aba == ba
    assert not any("OTHER" in name for host in aba for name in host["gpus"])


@pytest.mark.parametrize("workers", [1, 2])
@in_fork
def test_warnings_before_an_error_come_out_as_from_one_record_after_another(workers):
    """A record skipped (malformed samples), then one whose group is unknown: its
    warning is written before the error is raised, as one record after another did."""
    import copy
    import io

    from milarun.analysis.summary import summarize_with

    a, _ = _fixture_records()
    bad = copy.deepcopy(a)
    bad["timings"]["train"]["samples"] = [{"start": 5, "end": 1, "rate": 1}]
    noname = copy.deepcopy(a)
    noname.pop("name")
    noname["partition"] = "nonesuch"
    warn = io.StringIO()
    with pytest.raises(KeyError):
        summarize_with([bad, a, noname], warn=warn, workers=workers)
    assert "end 1 is before start 5" in warn.getvalue()


@pytest.mark.parametrize("workers", [1, 2])
@in_fork
def test_a_failing_test_summary_raises_the_first_in_order_after_the_warnings(workers, monkeypatch):
    import copy
    import io

    from milarun.analysis import summary

    a, _ = _fixture_records()
    recs = []
    for name in ("t9", "t1", "t5"):
        rec = copy.deepcopy(a)
        rec["name"], rec["partition"] = name, "nonesuch"
        recs.append(rec)
    bad = copy.deepcopy(a)
    bad["timings"]["train"]["samples"] = [{"start": 5, "end": 1, "rate": 1}]
    recs.append(bad)

    def boom(gname, kept):
        raise ValueError(gname)

    monkeypatch.setattr(summary, "_summarize_group", boom)
    warn = io.StringIO()
    with pytest.raises(ValueError, match="t1"):
        summary.summarize_with(recs, warn=warn, workers=workers)
    assert "end 1 is before start 5" in warn.getvalue()
