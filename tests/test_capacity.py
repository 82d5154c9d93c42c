"""The capacity search (milarun/measure/capacity.py) against fake systems of known capacity."""

import pytest

from milarun.measure.capacity import CapacitySearch, run_search

THRESHOLD = 7.3


def fake(load):
    """A system that meets its SLO at loads up to 7.3 and fails above."""
    return load <= THRESHOLD


def search(start=1.0, **kw):
    args = {"integer": False, "lowest": 0.5, "highest": 64.0, "max_steps": 20}
    args.update(kw)
    return CapacitySearch(start, **args)


def test_float_converges_below_the_threshold():
    s = run_search(search(), fake)
    # By hand: 1, 2, 4 pass; 8 fails -> bracket (4, 8); 6 passes (8/6 = 1.33); 7 passes
    # (8/7 = 1.14 > 1.1); 7.5 fails -> 7.5/7 = 1.071 <= 1.1: converged after 7 levels.
    assert s.steps == [
        (1.0, True),
        (2.0, True),
        (4.0, True),
        (8.0, False),
        (6.0, True),
        (7.0, True),
        (7.5, False),
    ]
    assert s.done and s.reason == "converged" and s.next_load() is None
    assert s.capacity == 7.0 and s.bracket == (7.0, 7.5)
    assert s.capacity <= THRESHOLD <= s.capacity * 1.1


def test_finer_resolution_takes_more_steps():
    s = run_search(search(resolution=0.01), fake)
    # After 7.5 fails (bracket 7, 7.5): 7.25 passes, 7.375 fails (7.375/7.25 = 1.017),
    # 7.3125 fails -> 7.3125/7.25 = 1.0086 <= 1.01.
    assert [load for load, _ in s.steps[7:]] == [7.25, 7.375, 7.3125]
    assert s.reason == "converged" and s.capacity == 7.25


def test_integer_finds_exactly_seven():
    s = run_search(search(1, integer=True, lowest=1, highest=64), fake)
    # 1, 2, 4 pass; 8 fails; (4 + 8) // 2 = 6 passes; (6 + 8) // 2 = 7 passes; 8 - 7 = 1.
    assert s.steps == [(1, True), (2, True), (4, True), (8, False), (6, True), (7, True)]
    assert s.reason == "converged" and s.capacity == 7 and isinstance(s.capacity, int)


def test_integer_from_above_halves_then_bisects():
    s = run_search(search(20, integer=True, lowest=1, highest=64), fake)
    # 20 fails, 10 fails, 5 passes -> (5, 10); 7 passes -> (7, 10); 8 fails -> (7, 8).
    assert s.steps == [(20, False), (10, False), (5, True), (7, True), (8, False)]
    assert s.capacity == 7 and s.reason == "converged"


def test_integer_start_is_rounded_and_clamped():
    s = search(2.6, integer=True, lowest=1, highest=64)
    assert s.next_load() == 3 and isinstance(s.next_load(), int)
    # round(7.5) = 8 lies above highest 7.6, whose floor 7 is the highest integer load.
    assert search(7.5, integer=True, lowest=1, highest=7.6).next_load() == 7


def test_integer_never_measures_a_load_twice_even_on_a_noisy_system():
    verdicts = iter([True, True, False, True, False, True, False, True, False, True])
    s = run_search(
        search(3, integer=True, lowest=1, highest=100, max_steps=10), lambda _: next(verdicts)
    )
    loads = [load for load, _ in s.steps]
    # 3, 6 pass; 12 fails -> 9 passes -> 10 fails -> converged at (9, 10).
    assert loads == [3, 6, 12, 9, 10] and s.capacity == 9
    assert len(set(loads)) == len(loads)


def test_passes_at_highest():
    s = run_search(search(highest=5.0), fake)
    assert [load for load, _ in s.steps] == [1.0, 2.0, 4.0, 5.0]
    assert s.reason == "passes at highest" and s.capacity == 5.0


def test_fails_at_lowest():
    s = run_search(search(4.0, lowest=0.5), lambda load: load <= 0.3)
    assert s.steps == [(4.0, False), (2.0, False), (1.0, False), (0.5, False)]
    assert s.reason == "fails at lowest" and s.capacity is None


def test_float_from_above_halves_then_bisects():
    s = run_search(search(64.0), fake)
    # 64, 32, 16, 8 fail; 4 passes -> (4, 8); then 6, 7 pass and 7.5 fails as from below.
    assert [load for load, _ in s.steps] == [64.0, 32.0, 16.0, 8.0, 4.0, 6.0, 7.0, 7.5]
    assert s.reason == "converged" and s.capacity == 7.0


def test_start_at_a_bound_ends_at_once():
    s = run_search(search(5.0, highest=5.0), fake)
    assert s.steps == [(5.0, True)] and s.reason == "passes at highest"
    s = run_search(search(0.5, lowest=0.5), lambda load: False)
    assert s.steps == [(0.5, False)] and s.reason == "fails at lowest"


def test_max_steps():
    s = run_search(search(max_steps=5), fake)
    # 1, 2, 4 pass, 8 fails, 6 passes: five levels, the bracket (6, 8) still open.
    assert [load for load, _ in s.steps] == [1.0, 2.0, 4.0, 8.0, 6.0]
    assert s.reason == "max steps" and s.capacity == 6.0 and s.next_load() is None


def test_the_last_step_converging_is_converged_not_max_steps():
    s = run_search(search(max_steps=7), fake)
    assert len(s.steps) == 7 and s.reason == "converged"


def test_record_checks_the_load():
    s = search()
    assert not s.done and s.reason is None and s.capacity is None
    with pytest.raises(ValueError, match="load"):
        s.record(2.0, True)
    with pytest.raises(ValueError, match="passed"):
        s.record(1.0, 1)
    s.record(1.0, True)
    assert s.next_load() == 2.0 and s.steps == [(1.0, True)]
    with pytest.raises(ValueError, match="load"):
        s.record(1.0, True)
    done = run_search(search(max_steps=1), fake)
    with pytest.raises(ValueError, match="done"):
        done.record(2.0, True)


@pytest.mark.parametrize(
    "start, kw, word",
    [
        (1.0, {"lowest": 0.0}, "start"),
        (1.0, {"lowest": -1.0}, "start"),
        (0.2, {}, "start"),
        (100.0, {}, "start"),
        (1.0, {"lowest": 2.0, "highest": 4.0}, "start"),
        (float("nan"), {}, "start"),
        (1.0, {"highest": float("inf")}, "highest"),
        (True, {}, "start"),
        (1.0, {"max_steps": 0}, "max_steps"),
        (1.0, {"max_steps": 2.0}, "max_steps"),
        (1.0, {"resolution": 0.0}, "resolution"),
        (1.0, {"resolution": -0.1}, "resolution"),
        (1.2, {"integer": True, "lowest": 1.1, "highest": 1.9}, "highest"),
    ],
)
def test_invalid_arguments(start, kw, word):
    with pytest.raises(ValueError, match=word):
        search(start, **kw)


def test_capacity_of_keeps_only_passes_below_every_failure():
    from milarun.measure.capacity import capacity_of

    assert capacity_of([(4.0, True), (8.0, True), (16.0, False), (12.0, True)]) == 12.0
    # re-judged: 8 now fails, so 12's pass above it does not count
    assert capacity_of([(4.0, True), (8.0, False), (16.0, False), (12.0, True)]) == 4.0
    assert capacity_of([(4.0, False), (2.0, False)]) is None
    assert capacity_of([]) is None
