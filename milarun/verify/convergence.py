"""The rules' ``convergence`` clause: every judged test's loss, step for step, against a
convergence reference the buyer trusts (docs/tender.md, "Convergence").

The reference is a summary (``milarun summary`` of the buyer's own reference run, or the
one shipped for the CPU profile) or a results folder, named by the rules' ``reference``
(relative to the rules file) and optionally pinned by ``reference_sha256``. Its tests'
``convergence`` entries (:mod:`milarun.analysis.convergence`) give one curve per seed;
the bundle's statistics recomputed from its records give the bidder's; the test is
:func:`milarun.measure.convergence.judge`.

A reference that cannot be used (unreadable, not a summary, pinned to another digest,
without the tests the rules name, with fewer than 2 seeds for one) is bad input: one
line naming the file and the key, exit 2, nothing judged (:func:`load_reference`). What
the bundle lacks (a test's records without a loss curve, another batch size or
precision) is a failed clause naming the records.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..analysis.convergence import items_problem, seed_curves
from ..analysis.summary import successful_records, summarize_dir
from ..errors import MilarunError
from ..formats.summary import read_summary
from ..measure.convergence import judge, seed_differences

#: The rules' default false-alarm rate of the whole clause (every test, both sides).
DEFAULT_ALPHA = 0.01
#: The rules' default floor of the reference's spread, relative to its mean curve value:
#: what the same test moved between thread counts and precisions on CPU
#: (docs/measurement.md, "Convergence references").
DEFAULT_TOLERANCE = 0.002


class Reference:
    """A loaded convergence reference.

    Attributes:
        path: the reference's path (a summary file or a results folder).
        tests: ``{group: (seed curves {seed: {step: loss}}, {seed: {step: items}},
            precision)}``.
    """

    def __init__(self, path: Path, tests: dict[str, tuple[dict, dict, str | None]]) -> None:
        self.path = path
        self.tests = tests


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_reference(rule: dict[str, Any], rules_path: str | Path) -> Reference:
    """The reference of the rules' ``convergence`` clause ``rule``.

    Args:
        rule: the clause (``reference``, optional ``reference_sha256``, ``tests`` and
            ``seed_tests``).
        rules_path: the rules file (``reference`` is relative to its folder).

    Raises:
        MilarunError: the reference cannot be read or is not a summary or results
            folder; ``reference_sha256`` names a folder or another digest; a test of
            ``tests`` absent from it or without loss curves; no test with loss curves;
            a test with fewer than 2 seeds; a ``seed_tests`` test not judged (one line
            naming the file and the key).
    """
    path = Path(rules_path).parent / rule["reference"]
    if path.is_dir():
        if "reference_sha256" in rule:
            raise MilarunError(
                "reference_sha256 pins a file, and the reference is a folder",
                path=rules_path,
                key="convergence.reference_sha256",
            )
        summary, _ = summarize_dir(path)
    else:
        try:
            want = rule.get("reference_sha256")
            if want is not None and _sha256(path) != want:
                raise MilarunError(
                    f"the reference's SHA-256 is {_sha256(path)}, the rules pin {want}",
                    path=path,
                    key="convergence.reference_sha256",
                )
        except OSError as exc:
            raise MilarunError(f"cannot read the reference ({exc.strerror})", path=path)
        summary = read_summary(path)
    entries = {
        g: t["convergence"]
        for g, t in (summary.get("tests") or {}).items()
        if isinstance(t, dict) and isinstance(t.get("convergence"), dict)
    }
    names = rule.get("tests") or sorted(entries)
    if not names:
        raise MilarunError(
            "no test with loss curves: not a convergence reference", path=path, key="tests"
        )
    tests = {}
    for g in names:
        if g not in entries:
            raise MilarunError(
                "missing: the rules judge this test and the reference has no loss curve for it",
                path=path,
                key=f"tests.{g}.convergence",
            )
        try:
            curves, items = seed_curves(entries[g])
        except (KeyError, TypeError, ValueError) as exc:
            raise MilarunError(
                f"malformed ({str(exc)[:100]})", path=path, key=f"tests.{g}.convergence"
            )
        if len(curves) < 2:
            raise MilarunError(
                f"{len(curves)} seed(s): a reference needs 2 or more to give a spread (run "
                f"it with --repeat 2 or more: run r runs at seed --seed + r)",
                path=path,
                key=f"tests.{g}.convergence",
            )
        tests[g] = (curves, items, entries[g].get("precision"))
    for g in rule.get("seed_tests", []):
        if g not in tests:
            raise MilarunError(
                "not a judged test of the reference", path=rules_path, key=f"seed_tests.{g}"
            )
    return Reference(path, tests)


def _lacking(b, group):
    """Paths of the group's successful records without a loss curve."""
    out = []
    for path, rec in successful_records(b.records, group):
        train = (rec.get("timings") or {}).get("train") or {}
        if not (isinstance(train, dict) and train.get("loss_curve")):
            out.append(path)
    return out


def check_convergence(b, v, rule, reference: Reference) -> None:
    """The ``performance.convergence`` clauses: one per test of the reference (the rules'
    ``tests``), on the bundle's recomputed statistics ``b.summary``.

    Each side of each test is judged at ``alpha / (2 k)`` for ``k`` tests (Bonferroni),
    so the clause as a whole wrongly fails an honest bundle with probability at most
    ``alpha`` (normal curve values; docs/measurement.md gives the simulated rate).
    """
    alpha = rule.get("alpha", DEFAULT_ALPHA)
    tolerance = rule.get("tolerance", DEFAULT_TOLERANCE)
    side = alpha / (2 * len(reference.tests))
    tests = ((b.summary or {}).get("tests")) or {}
    name = "performance.convergence"
    for group, (ref_curves, ref_items, ref_precision) in sorted(reference.tests.items()):
        lacking = _lacking(b, group)
        entry = (tests.get(group) or {}).get("convergence")
        if lacking or not isinstance(entry, dict):
            v.add(
                "performance",
                name,
                False,
                f"{group}: {len(lacking)} successful record(s) without timings.train.loss_curve"
                if lacking
                else f"{group}: no successful record of the test with a loss curve",
                lacking[:20],
            )
            continue
        curves, items = seed_curves(entry)
        precision = entry.get("precision")
        if precision != ref_precision:
            v.add(
                "performance",
                name,
                False,
                f"{group}: --precision {precision} where the reference ran "
                f"{ref_precision}: the reference is for another test",
            )
            continue
        j = judge(list(ref_curves.values()), list(curves.values()), side, tolerance)
        if j is None:
            v.add(
                "performance",
                name,
                False,
                f"{group}: no checkpoint step that the reference's and the bundle's runs "
                "all reached",
            )
            continue
        problem = items_problem(ref_items, items, j.steps[-1])
        if problem is not None:
            v.add("performance", name, False, f"{group}: {problem}")
            continue
        if "seed_tolerance" in rule and group in rule.get("seed_tests", [group]):
            _seed_clause(v, group, ref_curves, curves, rule["seed_tolerance"])
        what = {
            "ok": "within",
            "faster": "converges faster than the reference can: below",
            "slower": "does not converge like the reference: above",
        }[j.verdict]
        v.add(
            "performance",
            name,
            j.verdict == "ok",
            f"{group}: mean loss over steps {j.steps[-1] // 2 + 1}-{j.steps[-1]} (the "
            f"last block every run completed) {j.bidder:.5g} over {j.n_bidder} seed(s); "
            f"{what} the bounds "
            f"[{j.lo:.5g}, {j.hi:.5g}] around the reference's {j.reference:.5g} "
            f"({j.n_reference} seeds, spread {j.spread:.3g}, used {j.scale:.3g}; "
            f"{side:.2g} a side)",
        )


def _seed_clause(v, group, ref_curves, curves, bound):
    """``performance.convergence-seeds``: every seed both sides ran within ``bound``
    (relative) of the reference's curve at that seed, step for step."""
    diffs = seed_differences(ref_curves, curves)
    if not diffs:
        v.add(
            "performance",
            "performance.convergence-seeds",
            True,
            f"{group}: no seed in common with the reference (the bundle's: "
            f"{', '.join(map(str, sorted(curves, key=repr)[:8]))}): judged by the spread "
            "over seeds only (a changed --seed is an argv override)",
        )
        return
    seed, (diff, step) = max(diffs.items(), key=lambda kv: kv[1][0])
    v.add(
        "performance",
        "performance.convergence-seeds",
        diff <= bound,
        f"{group}: {len(diffs)} seed(s) in common with the reference; the largest "
        f"difference {diff:.2g} of the loss (seed {seed}, step {step}) "
        f"{'<=' if diff <= bound else '>'} {bound:.2g}"
        + ("" if diff <= bound else ": not the reference's computation at that seed"),
    )


__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_TOLERANCE",
    "Reference",
    "check_convergence",
    "load_reference",
]
