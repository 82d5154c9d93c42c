"""The rate logger with a fake clock: windows, warm-up flags, stopping, no per-step sync."""

import pytest

from milarun.bench.rate import RateLogger


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class CountingTimer:
    """A timer like the CUDA one: counts how often it synchronizes."""

    def __init__(self, clock):
        self.clock = clock
        self.syncs = 0
        self.marks = 0

    def mark(self):
        self.marks += 1
        return self.clock()

    def elapsed(self, start, end):
        self.syncs += 1
        return end - start


def test_windows_rates_and_warmup_flags():
    clock = FakeClock()
    logger = RateLogger(sample_duration=0.5, max_count=1000, warmup=2,
                        host_clock=clock, timer=CountingTimer(clock), origin=100.0)
    steps = 0
    for step in logger.steps():
        clock.t += 0.125        # each step takes 0.125 s (exact in binary)
        step.set_count(10)      # 10 items: 80 items/s
        step.log(loss=1.0 / (steps + 1))
        steps += 1
    assert steps == 100 and logger.total == 1000
    # 4 steps per 0.5 s window
    assert len(logger.samples) == 25
    assert all(s["count"] == 40 for s in logger.samples)
    assert all(s["rate"] == pytest.approx(80.0) for s in logger.samples)
    assert [s["warmup"] for s in logger.samples[:3]] == [True, True, False]
    first = logger.samples[0]
    assert first["start"] == pytest.approx(0.0) and first["end"] == pytest.approx(0.5)
    assert logger.samples[-1]["end"] == pytest.approx(12.5)
    assert logger.metrics["loss"] == pytest.approx(1.0 / 100)
    assert logger.summary()["warmup"] == 2


def test_one_sync_and_one_mark_per_window_not_per_step():
    clock = FakeClock()
    timer = CountingTimer(clock)
    logger = RateLogger(sample_duration=1.0, max_count=600, warmup=0, host_clock=clock,
                        timer=timer)
    for step in logger.steps():
        clock.t += 0.01
        step.set_count(1)
    # one mark per window boundary (plus the start), one sync per window
    assert timer.marks == len(logger.samples) + 1 == 7
    assert timer.syncs == len(logger.samples) == 6


def test_partial_last_window_is_kept_and_max_count_stops():
    clock = FakeClock()
    logger = RateLogger(sample_duration=1.0, max_count=25, warmup=0, host_clock=clock,
                        timer=CountingTimer(clock))
    for step in logger.steps():
        clock.t += 0.3
        step.set_count(10)
    # 3 steps of 10 items: stops at 30 ≥ 25; windows: [0.3, 0.6, 0.9 → not yet 1 s]... done
    assert logger.total == 30
    assert sum(s["count"] for s in logger.samples) == 30
    assert logger.samples[-1]["rate"] == pytest.approx(10 / 0.3)


def test_loop_restarts_epochs_and_rejects_empty_loader():
    clock = FakeClock()
    logger = RateLogger(sample_duration=0.2, max_count=7, warmup=0, host_clock=clock,
                        timer=CountingTimer(clock))
    seen = []
    for step, batch in logger.loop([1, 2, 3]):
        clock.t += 0.1
        seen.append(batch)
        step.set_count(1)
    assert seen == [1, 2, 3, 1, 2, 3, 1]
    empty = RateLogger(max_count=5, host_clock=clock, timer=CountingTimer(clock))
    with pytest.raises(RuntimeError, match="yielded no batch"):
        for _ in empty.loop([]):
            pass


def test_bad_sample_duration():
    with pytest.raises(ValueError):
        RateLogger(sample_duration=0)
