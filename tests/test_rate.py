"""The rate logger with a fake clock: windows, warm-up flags, stopping, no per-step sync."""

import pytest

from milarun.bench.rate import RateLogger, Step


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
    logger = RateLogger(
        sample_duration=0.5,
        max_count=1000,
        warmup=2,
        host_clock=clock,
        timer=CountingTimer(clock),
        origin=100.0,
    )
    steps = 0
    for step in logger.steps():
        clock.t += 0.125  # each step takes 0.125 s (exact in binary)
        step.set_count(10)  # 10 items: 80 items/s
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
    logger = RateLogger(sample_duration=1.0, max_count=600, warmup=0, host_clock=clock, timer=timer)
    for step in logger.steps():
        clock.t += 0.01
        step.set_count(1)
    # one mark per window boundary (plus the start), one sync per window
    assert timer.marks == len(logger.samples) + 1 == 7
    assert timer.syncs == len(logger.samples) == 6


def test_partial_last_window_is_kept_and_max_count_stops():
    clock = FakeClock()
    logger = RateLogger(
        sample_duration=1.0, max_count=25, warmup=0, host_clock=clock, timer=CountingTimer(clock)
    )
    for step in logger.steps():
        clock.t += 0.3
        step.set_count(10)
    # 3 steps of 10 items: stops at 30 ≥ 25; windows: [0.3, 0.6, 0.9 → not yet 1 s]... done
    assert logger.total == 30
    assert sum(s["count"] for s in logger.samples) == 30
    assert logger.samples[-1]["rate"] == pytest.approx(10 / 0.3)


def test_loop_restarts_epochs_and_rejects_empty_loader():
    clock = FakeClock()
    logger = RateLogger(
        sample_duration=0.2, max_count=7, warmup=0, host_clock=clock, timer=CountingTimer(clock)
    )
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


def test_min_steady_extends_past_max_count():
    # 100 items/s; max_count 50 would stop after 0.5 s, inside warm-up
    clock = FakeClock()
    logger = RateLogger(
        sample_duration=0.5,
        max_count=50,
        warmup=2,
        host_clock=clock,
        timer=CountingTimer(clock),
        min_steady=3.0,
    )
    for step in logger.steps():
        clock.t += 0.125
        step.set_count(12)  # 96 items/s
    steady = [s for s in logger.samples if not s["warmup"]]
    steady_s = sum(s["end"] - s["start"] for s in steady)
    assert steady_s >= 3.0
    # no more than one extra window past the floor (2% margin, one step of slack)
    assert steady_s < 3.0 + 0.5 + 0.125
    assert logger.total > 50
    summary = logger.summary()
    assert summary["max_count"] == 50 and summary["min_steady"] == 3.0
    assert summary["count"] == logger.total


def test_max_count_1_with_an_instant_first_step_does_not_extend_for_hours():
    # the data loop's first batch is fetched before the first window opens, so with
    # --max-count 1 the first step can take ~0 s: its rate (millions of items/s) must
    # not size the extension; the run still ends right after its steady state
    clock = FakeClock()
    logger = RateLogger(
        sample_duration=0.25,
        max_count=1,
        warmup=2,
        host_clock=clock,
        timer=CountingTimer(clock),
        min_steady=2.0,
    )
    first = True
    for step in logger.steps():
        clock.t += 1e-6 if first else 0.05  # then 32 items every 0.05 s: 640 items/s
        first = False
        step.set_count(32)
        assert clock.t - 100.0 < 60, "the extension was sized from the instant first step"
    steady_s = sum(s["end"] - s["start"] for s in logger.samples if not s["warmup"])
    assert 2.0 <= steady_s < 2.0 + 0.25 + 0.05
    assert clock.t - 100.0 < 4


def test_min_steady_is_a_floor_not_a_cap():
    clock = FakeClock()
    logger = RateLogger(
        sample_duration=0.5,
        max_count=1000,
        warmup=1,
        host_clock=clock,
        timer=CountingTimer(clock),
        min_steady=1.0,
    )
    for step in logger.steps():
        clock.t += 0.125
        step.set_count(10)
    # 1000 items at 80 items/s = 12.5 s, far past the 1 s floor: max_count decides
    assert logger.total == 1000


def test_min_steady_extends_again_when_the_rate_drops():
    clock = FakeClock()
    logger = RateLogger(
        sample_duration=0.5,
        max_count=10,
        warmup=0,
        host_clock=clock,
        timer=CountingTimer(clock),
        min_steady=4.0,
    )
    n = 0
    for step in logger.steps():
        n += 1
        clock.t += 0.1 if n <= 10 else 0.4  # the rate falls 4x after 10 steps
        step.set_count(1)
    steady_s = sum(s["end"] - s["start"] for s in logger.samples)
    assert steady_s >= 4.0


def test_first_extension_uses_a_measured_rate_not_the_launch_rate():
    # Like a GPU: the host only queues steps (0.01 s each) while the device
    # takes ten times longer; the timer reports device time.
    class DeviceTimer(CountingTimer):
        def elapsed(self, start, end):
            self.syncs += 1
            return 10 * (end - start)

    clock = FakeClock()
    proposals = []

    def agree(extra):
        proposals.append(extra)
        return extra

    logger = RateLogger(
        sample_duration=0.5,
        max_count=5,
        warmup=0,
        host_clock=clock,
        timer=DeviceTimer(clock),
        min_steady=2.0,
        agree=agree,
    )
    gen = logger.steps()
    for _ in range(5):
        step = next(gen)
        clock.t += 0.01
        step.set_count(1)
    next(gen)  # the 5th step reached max_count: the first extension was decided
    # device rate 10 items/s -> about 20 items for 2 s; the host rate would give 200
    assert proposals and proposals[0] <= 25
    assert logger.samples[0]["rate"] == pytest.approx(10.0)


def test_agree_sets_the_same_target_on_every_rank():
    # Two ranks step in lockstep (same items per step) but their host clocks
    # differ, so each proposes a different extension; agree() plays the
    # all_reduce(MAX) and both must stop on the same step.
    clocks = [FakeClock(), FakeClock()]
    proposals = [[], []]

    def make_agree(rank):
        def agree(extra):
            proposals[rank].append(extra)
            return extra

        return agree

    loggers = [
        RateLogger(
            sample_duration=0.5,
            max_count=20,
            warmup=1,
            host_clock=c,
            timer=CountingTimer(c),
            min_steady=2.0,
            agree=make_agree(r),
        )
        for r, c in enumerate(clocks)
    ]
    # First pass without coordination: the two proposals differ.
    for lg in loggers:
        lg.start()
    for _ in range(10):
        for r, lg in enumerate(loggers):
            clocks[r].t += 0.05 * (r + 1)
            st = Step()
            st.set_count(2)
            lg.end_step(st)
    assert proposals[0][0] != proposals[1][0]
    assert loggers[0].max_count - 20 == proposals[0][0]

    # Second pass with MAX agreement: the same target on both ranks.
    clocks = [FakeClock(), FakeClock()]
    target = max(proposals[0][0], proposals[1][0])
    loggers = [
        RateLogger(
            sample_duration=0.5,
            max_count=20,
            warmup=1,
            host_clock=c,
            timer=CountingTimer(c),
            min_steady=2.0,
            agree=lambda extra: max(extra, target),
        )
        for c in clocks
    ]
    steps = [0, 0]
    gens = [lg.steps() for lg in loggers]
    for _ in range(10_000):
        alive = False
        for r, g in enumerate(gens):
            st = next(g, None)
            if st is None:
                continue
            alive = True
            clocks[r].t += 0.05 * (r + 1)
            st.set_count(2)
            steps[r] += 1
        if not alive:
            break
    assert steps[0] == steps[1]
    assert loggers[0].total == loggers[1].total > 20


def test_bad_min_steady():
    with pytest.raises(ValueError):
        RateLogger(min_steady=-1)


def test_every_rank_votes_at_the_count_target_and_follows_the_agreed_extension():
    # The rank whose own steady state is long enough must still take
    # part in the agreement (voting 0) and extend when another rank is short.
    clock = FakeClock()
    votes = []

    def agree(extra):  # all_reduce(MAX) with a peer that is 30 items short
        votes.append(extra)
        return max(extra, 30) if len(votes) == 1 else extra

    logger = RateLogger(
        sample_duration=0.5,
        max_count=40,
        warmup=1,
        host_clock=clock,
        timer=CountingTimer(clock),
        min_steady=2.0,
        agree=agree,
    )
    for step in logger.steps():
        clock.t += 0.1  # 40 steps = 4 s: 3.5 s of steady state, past the floor
        step.set_count(1)
    assert votes[0] == 0  # this rank was not short, but it voted
    assert logger.total == 40 + 30  # and took the peer's extension
    assert votes[1:] == [0]  # at the new target: voted again, no one short


def test_no_extension_when_every_rank_votes_zero():
    clock = FakeClock()
    votes = []
    logger = RateLogger(
        sample_duration=0.5,
        max_count=40,
        warmup=1,
        host_clock=clock,
        timer=CountingTimer(clock),
        min_steady=2.0,
        agree=lambda extra: votes.append(extra) or extra,
    )
    for step in logger.steps():
        clock.t += 0.1
        step.set_count(1)
    assert votes == [0] and logger.total == 40


def test_a_follower_rank_votes_zero_and_never_times_a_window():
    clock = FakeClock()
    timer = CountingTimer(clock)
    votes = []

    def agree(extra):  # rank 0 (the timing rank) asks for 25 more items, once
        votes.append(extra)
        return 25 if len(votes) == 1 else 0

    logger = RateLogger(
        sample_duration=0.5,
        max_count=40,
        warmup=1,
        host_clock=clock,
        timer=timer,
        min_steady=60.0,
        agree=agree,
    )
    logger.follow()
    for step in logger.steps():
        clock.t += 0.1
        step.set_count(1)
    assert votes == [0, 0]  # short of 60 s by its own clock, yet it votes 0
    assert logger.total == 65
    assert timer.syncs == 0  # the device timer is never synchronized on
    assert len(logger.samples) <= 2  # no periodic windows (one for the first vote, one at the end)


def _serving_logger(clock, max_count=1000):
    return RateLogger(
        sample_duration=0.5,
        max_count=max_count,
        warmup=0,
        host_clock=clock,
        timer=CountingTimer(clock),
        origin=100.0,
    )


def test_items_counted_by_hand_close_windows_within_a_step():
    # One step (a batch) streams 8 tokens of 3 requests each, 0.125 s apart: the windows
    # close every 0.5 s within it, not once at its end.
    clock = FakeClock()
    logger = _serving_logger(clock, max_count=48)
    batches = 0
    for step in logger.steps():
        for _ in range(8):
            clock.t += 0.125
            logger.count(3)
        batches += 1
        assert step.count == 0  # the step itself counted nothing
    assert batches == 2 and logger.total == 48
    assert [s["count"] for s in logger.samples] == [12, 12, 12, 12]
    assert [s["end"] - s["start"] for s in logger.samples] == [0.5] * 4
    assert all(s["rate"] == pytest.approx(24.0) for s in logger.samples)


def test_paused_time_is_in_no_window():
    # Each batch: a 2 s prefill (paused), then 4 tokens of 5 items, 0.125 s apart.
    clock = FakeClock()
    logger = _serving_logger(clock, max_count=60)
    for _step in logger.steps():
        logger.pause()
        clock.t += 2.0
        logger.resume()
        for _ in range(4):
            clock.t += 0.125
            logger.count(5)
    assert logger.total == 60
    assert [s["count"] for s in logger.samples] == [20, 20, 20]
    # every window is the 0.5 s of a batch's decoding: the prefills are left out
    assert [(s["start"], s["end"]) for s in logger.samples] == [
        (2.0, 2.5),
        (4.5, 5.0),
        (7.0, 7.5),
    ]
    assert all(s["rate"] == pytest.approx(40.0) for s in logger.samples)


def test_pause_closes_a_short_window_and_paused_wraps_a_block():
    clock = FakeClock()
    logger = _serving_logger(clock, max_count=20)
    for _step in logger.steps():
        clock.t += 0.25
        logger.count(10)  # half a window: still open
        assert logger.samples == []
        with logger.paused():  # closes it, a sample of 0.25 s
            clock.t += 5.0
        assert [(s["start"], s["end"], s["count"]) for s in logger.samples] == [(0.0, 0.25, 10)]
        clock.t += 0.5
        logger.count(10)
    assert [(s["start"], s["end"], s["count"]) for s in logger.samples][1] == (5.25, 5.75, 10)


def test_pause_resume_and_count_refuse_misuse():
    clock = FakeClock()
    logger = _serving_logger(clock)
    logger.start()
    with pytest.raises(RuntimeError, match="without pause"):
        logger.resume()
    logger.pause()
    with pytest.raises(RuntimeError, match="paused already"):
        logger.pause()
    with pytest.raises(RuntimeError, match="while the rate logger is paused"):
        logger.count(1)
    assert logger.total == 0
    logger.resume()
    clock.t += 1.0
    logger.count(4)
    assert logger.total == 4 and logger.samples[-1]["count"] == 4
