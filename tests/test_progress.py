"""The suite progress display: estimates, time left, plain and live output, closed terminals."""

import errno
import io
import os
import re
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from milarun.launcher.progress import (
    SuiteProgress,
    clean_line,
    decide_live,
    estimate_seconds,
    format_duration,
)

ESC = "\x1b"


def job(name="a", timeout=1800.0, **arguments):
    return SimpleNamespace(name=name, full_name=f"s.{name}", timeout=timeout, arguments=arguments)


def launch(j, run=0, device="0", group=None):
    return SimpleNamespace(
        job=j,
        name=j.full_name,
        run=run,
        device=device,
        group=group or j.full_name,
        job_id=f"{run}.{device}",
        timeout=j.timeout,
    )


def outcome(lch, success=True, duration=1.0, reason=None):
    return SimpleNamespace(
        launch=lch,
        success=success,
        reason=reason,
        duration=duration,
        result_path=f"/out/{lch.group}.J{lch.job_id}.json",
    )


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def suite():
    """Job ``a``: per-gpu on 2 devices × 2 runs (floor 20 s); job ``b``: one launch (floor 10 s)."""
    a = job("a", **{"--min-steady": 20, "--warmup": 0})
    b = job("b", **{"--min-steady": 10, "--warmup": 0})
    launches = [launch(a, r, d) for r in (0, 1) for d in ("0", "1")] + [launch(b, 0, "all")]
    return a, b, launches


# -- estimate_seconds ---------------------------------------------------------------------


def test_estimate_uses_the_option_defaults_when_unset():
    # bench/options.py: min_steady 0 s, warmup 3 windows of 0.5 s
    assert estimate_seconds(job(), startup=0) == pytest.approx(1.5)
    assert estimate_seconds(job(), startup=7) == pytest.approx(8.5)


def test_estimate_from_min_steady_and_warmup_windows():
    j = job(**{"--min-steady": 30, "--warmup": 4, "--sample-duration": 0.25})
    assert estimate_seconds(j, startup=5) == pytest.approx(30 + 4 * 0.25 + 5)
    # flags written without dashes or with underscores name the same options
    j2 = job(**{"min_steady": 30, "warmup": 4, "sample-duration": 0.25})
    assert estimate_seconds(j2, startup=5) == pytest.approx(36)


def test_estimate_is_capped_by_the_timeout():
    assert estimate_seconds(job(timeout=60, **{"--min-steady": 1000})) == 60


def test_estimate_ignores_bad_values():
    j = job(**{"--min-steady": "soon", "--warmup": float("nan"), "--sample-duration": -1})
    assert estimate_seconds(j, startup=0) == pytest.approx(1.5)


def test_progress_and_estimate_do_not_import_torch():
    code = (
        "import sys; from types import SimpleNamespace as N; "
        "from milarun.launcher.progress import estimate_seconds as e; "
        "print(e(N(arguments={}, timeout=10.0)), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[1] == "False"


def test_format_duration():
    assert format_duration(45.4) == "45 s"
    assert format_duration(185) == "3 min 5 s"
    assert format_duration(3900) == "1 h 5 min"


# -- time left ------------------------------------------------------------------------------


def test_eta_falls_as_launches_finish_and_uses_measured_durations():
    a, b, launches = suite()
    clock = Clock()
    p = SuiteProgress(launches, stream=io.StringIO(), live=False, startup=0, clock=clock)
    # waves: a run 0 (20 s), a run 1 (20 s), b (10 s); per-device launches run at once
    assert p.status()["eta_s"] == pytest.approx(50)
    p.started(launches[:2])
    clock.t += 5
    assert p.status()["eta_s"] == pytest.approx(45)
    clock.t += 3
    p.finished(outcome(launches[0], duration=8.0))
    # group a now measured at 8 s: its running twin is due now, run 1 costs 8 s, b 10 s
    st = p.status()
    assert st["eta_s"] == pytest.approx(18)
    assert (st["done"], st["total"], st["passed"], st["failed"]) == (1, 5, 1, 0)
    assert st["elapsed_s"] == pytest.approx(8)
    p.finished(outcome(launches[1], success=False, reason="timeout", duration=12.0))
    assert p.status()["eta_s"] == pytest.approx(10 + 10)  # mean(8, 12) for run 1, then b
    p.started(launches[2:4])
    for lch in launches[2:4]:
        p.finished(outcome(lch, duration=10.0))
    p.started(launches[4:])
    p.finished(outcome(launches[4], duration=3.0))
    assert p.status() | {"elapsed_s": 0} == {
        "done": 5,
        "total": 5,
        "passed": 4,
        "failed": 1,
        "elapsed_s": 0,
        "eta_s": 0.0,
    }


def test_a_missing_duration_is_measured_from_the_start():
    a, b, launches = suite()
    clock = Clock()
    p = SuiteProgress(launches, stream=io.StringIO(), live=False, startup=0, clock=clock)
    p.started(launches[:2])
    clock.t += 6
    p.finished(outcome(launches[0], duration=None))
    assert p.expected(launches[2]) == pytest.approx(6)


def test_baseline_durations_replace_the_floor_until_measured():
    a, b, launches = suite()
    p = SuiteProgress(
        launches,
        stream=io.StringIO(),
        live=False,
        startup=0,
        clock=Clock(),
        baseline={"s.b": 100.0, "s.a": float("nan")},
    )
    assert p.status()["eta_s"] == pytest.approx(20 + 20 + 100)  # nan ignored: a keeps its floor


def test_gpu_progression_steps_are_separate_waves():
    j = job("scaling", **{"--min-steady": 10, "--warmup": 0})
    steps = [launch(j, 0, f"0-{k - 1}", group=f"s.scaling.{k}") for k in (1, 2, 3)]
    p = SuiteProgress(steps, stream=io.StringIO(), live=False, startup=0, clock=Clock())
    assert p.status()["eta_s"] == pytest.approx(30)


# -- plain output ----------------------------------------------------------------------------


def test_plain_output_has_counters_and_no_escape_codes():
    a, b, launches = suite()
    clock = Clock()
    out = io.StringIO()
    with SuiteProgress(launches, stream=out, live=False, startup=0, clock=clock) as p:
        p.message("milarun: prepare: build data")
        for wave in (launches[:2], launches[2:4], launches[4:]):
            p.started(wave)
            p.child_output(wave[0], "\x1b[31mloss 0.5\x1b[0m")  # not shown: not verbose
            clock.t += 130
            for lch in wave:
                p.finished(outcome(lch, success=lch is not launches[4], reason="oom", duration=130))
    text = out.getvalue()
    assert ESC not in text and "loss" not in text
    lines = text.splitlines()
    assert lines[0] == "milarun: prepare: build data"
    assert "milarun: [0/5] 0 s elapsed, about 50 s left; starting s.a J0.0, s.a J0.1" in lines
    assert "milarun: [1/5] s.a J0.0: PASS in 130.0 s -> /out/s.a.J0.0.json" in lines
    assert "milarun: [2/5] 2 min 10 s elapsed, about 2 min 20 s left" in lines
    assert "milarun: [5/5] s.b J0.all: FAIL (oom) in 130.0 s -> /out/s.b.J0.all.json" in lines
    assert lines[-1] == "milarun: [5/5] 6 min 30 s elapsed, 4 passed, 1 failed"


def test_verbose_prefixes_every_child_line_and_strips_escapes():
    a, b, launches = suite()
    out = io.StringIO()
    p = SuiteProgress(launches, stream=out, live=False, verbose=True)
    p.child_output(launches[1], "epoch 1\n")
    p.child_output(launches[4], b"\x1b[1mbold\x1b[0m\r\n")
    p.child_output(launches[4], "10%\r50%\r")
    assert out.getvalue().splitlines() == [
        "[s.a J0.1] epoch 1",
        "[s.b J0.all] bold",
        "[s.b J0.all] 50%",
    ]


def test_clean_line():
    assert clean_line("\x1b]0;title\x07a\tb\x00c\n") == "a\tbc"


class InterleaveDetector(io.StringIO):
    """A stream that notices two writes running at once (it yields in the middle of each)."""

    def __init__(self):
        super().__init__()
        self.inside = 0
        self.overlaps = 0

    def write(self, text):
        self.inside += 1
        if self.inside > 1:
            self.overlaps += 1
        half = len(text) // 2
        super().write(text[:half])
        time.sleep(0.0001)
        super().write(text[half:])
        self.inside -= 1
        return len(text)


def test_child_output_is_thread_safe():
    a, b, launches = suite()
    out = InterleaveDetector()
    p = SuiteProgress(launches, stream=out, live=False, verbose=True)

    def pump(lch):
        for i in range(100):
            p.child_output(lch, f"line {i} of {lch.job_id}\n")

    threads = [threading.Thread(target=pump, args=(lch,)) for lch in launches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = out.getvalue().splitlines()
    assert out.overlaps == 0
    assert len(lines) == 500
    assert all(re.fullmatch(r"\[s\.[ab] J(\d\.\w+)\] line \d+ of \1", x) for x in lines)


# -- closed terminals ----------------------------------------------------------------------


class Broken(io.StringIO):
    """A stream that works for ``ok`` writes, then fails like a closed terminal."""

    def __init__(self, exc, ok=0, tty=True):
        super().__init__()
        self.exc, self.ok, self.tty = exc, ok, tty

    def isatty(self):
        return self.tty

    def write(self, text):
        if self.ok <= 0:
            raise self.exc
        self.ok -= 1
        return super().write(text)

    def flush(self):
        if self.ok <= 0:
            raise self.exc


def exercise(p, launches):
    with p:
        p.message("hello")
        p.started(launches[:2])
        p.child_output(launches[0], "step")
        for lch in launches[:2]:
            p.finished(outcome(lch))
        p.started(launches[2:])
        for lch in launches[2:]:
            p.finished(outcome(lch, success=False, reason="killed"))
        p.message("bye")
    return p.status()


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.EIO, "Input/output error"),
        BrokenPipeError(errno.EPIPE, "Broken pipe"),
        ValueError("I/O operation on closed file"),
    ],
)
@pytest.mark.parametrize("live", [False, True])
@pytest.mark.parametrize("verbose", [False, True])
@pytest.mark.parametrize("ok", [0, 3])
def test_a_closed_terminal_never_raises(exc, live, verbose, ok):
    a, b, launches = suite()
    p = SuiteProgress(launches, stream=Broken(exc, ok=ok), live=live, verbose=verbose)
    st = exercise(p, launches)
    assert (st["done"], st["passed"], st["failed"]) == (5, 2, 3)  # the counting goes on
    assert p.display_lost and type(exc).__name__ in p.display_lost
    assert p._progress is None  # the live display is stopped


def test_a_hung_up_terminal_never_raises(monkeypatch):
    # a real terminal whose other side went away (a closed SSH session): writes get EIO
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    master, slave = os.openpty()
    tty = open(slave, "w", buffering=1)
    a, b, launches = suite()
    try:
        p = SuiteProgress(launches, stream=tty, verbose=True)
        assert p.live is True
        with p:
            p.started(launches[:2])
            os.close(master)
            p.child_output(launches[0], "step")
            p.finished(outcome(launches[0]))
            time.sleep(0.3)  # let the refresh thread hit the closed terminal too
        assert p.display_lost == "OSError: [Errno 5] Input/output error"
        assert p.status()["done"] == 1
    finally:
        try:
            tty.close()
        except OSError:
            pass


def test_a_closed_stringio_never_raises():
    a, b, launches = suite()
    out = io.StringIO()
    out.close()
    p = SuiteProgress(launches, stream=out, live=False, verbose=True)
    assert exercise(p, launches)["done"] == 5
    assert "closed file" in p.display_lost


def test_an_unencodable_line_is_replaced_not_fatal():
    a, b, launches = suite()
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii", errors="strict", write_through=True)
    p = SuiteProgress(launches, stream=out, live=False, verbose=True)
    p.child_output(launches[0], "caf\u00e9 \u2192 ok")
    p.message("after")
    assert p.display_lost is None
    assert raw.getvalue().decode() == "[s.a J0.0] caf? ? ok\nafter\n"


def test_a_working_stream_loses_nothing():
    a, b, launches = suite()
    p = SuiteProgress(launches, stream=io.StringIO(), live=False)
    exercise(p, launches)
    assert p.display_lost is None


# -- live display --------------------------------------------------------------------------


def test_live_bar_shows_counts_and_the_last_child_line():
    a, b, launches = suite()
    out = io.StringIO()
    with SuiteProgress(launches, stream=out, live=True, startup=0) as p:
        p.started(launches[:2])
        p.finished(outcome(launches[0], duration=4.0))
        p.child_output(launches[1], "epoch 3 loss 0.25\n")
        p.message("milarun: a note [bold]not markup[/bold]")
    text = out.getvalue()
    assert ESC in text  # a terminal: the bar is drawn with escape codes
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert "1/5" in plain and "1 passed" in plain and "0 failed" in plain
    assert "left" in plain
    assert "s.a J0.0: PASS in 4.0 s" in plain  # printed above the bar
    assert "s.a J0.1: epoch 3 loss 0.25" in plain  # last line of a running launch
    assert "[bold]not markup[/bold]" in plain


def test_live_verbose_prints_every_line_above_the_bar():
    a, b, launches = suite()
    out = io.StringIO()
    with SuiteProgress(launches, stream=out, live=True, verbose=True) as p:
        p.started(launches[:2])
        for i in range(3):
            p.child_output(launches[1], f"line {i}")
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert all(f"[s.a J0.1] line {i}" in plain for i in range(3))


def test_live_child_output_from_threads():
    a, b, launches = suite()
    with SuiteProgress(launches, stream=io.StringIO(), live=True) as p:
        p.started(launches[:4])
        threads = [
            threading.Thread(
                target=lambda lch=lch: [p.child_output(lch, f"n {i}") for i in range(200)]
            )
            for lch in launches[:4]
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(p._tail_view) == sorted(
            (f"{lch.group} J{lch.job_id}", "n 199") for lch in launches[:4]
        )


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize(
    "stream, env, live",
    [
        (Tty(), {}, True),
        (Tty(), {"CI": "true"}, False),
        (Tty(), {"CI": "1"}, False),
        (Tty(), {"CI": "false"}, True),
        (Tty(), {"TERM": "dumb"}, False),
        (io.StringIO(), {}, False),
    ],
)
def test_decide_live(stream, env, live):
    assert decide_live(stream, env) is live


def test_live_is_decided_from_the_stream_and_ci(monkeypatch):
    monkeypatch.delenv("TERM", raising=False)
    monkeypatch.setenv("CI", "true")
    assert SuiteProgress([], stream=Tty()).live is False
    monkeypatch.delenv("CI")
    assert SuiteProgress([], stream=Tty()).live is True
    assert SuiteProgress([], stream=io.StringIO()).live is False
