"""The report's validation flags, energy columns, ``perf/W`` and host facts.

Added to a :class:`~milarun.report.table.Report` by :func:`add_checks` (called by
``build_report``); the text and HTML renderers show them with the helpers
below. The score does not change: flags are shown, not scored (failing
checks already made their results failures in the summary).

* Columns ``W``, ``J/item`` and ``items/J`` (only when a test has energy
  readings): the mean power of a result over its steady state (W, per
  process: per GPU for per-GPU tests), and the test's energy over its items
  (:mod:`milarun.measure.energy`).
* ``perf/W`` = the weighted geometric mean of ``items/J`` (items/s per W)
  over the scored tests that have it, with the score's weights: the score's
  formula applied to energy efficiency.
* Flags (:mod:`milarun.measure.flags`): the validation flags and the anomalies
  are both :class:`~milarun.measure.flags.Flag` values here; :func:`flag_line`
  is the text of one and :func:`flag_html` its HTML, for both sections.
* Host facts (:mod:`milarun.host.facts`): shown under each host in the
  header; with ``--compare``, every fact recorded on both sides that differs
  from the baseline's is a warning.
"""

from ..formats.terminal import one_line
from ..host import facts as hostfacts
from ..measure.flags import VALIDATION, from_summary
from .formatting import fmt_num, geomean_or_warn

#: The energy columns, in order.
ENERGY_COLUMNS = ("W", "J/item", "items/J")


def add_checks(report, summary, baseline=None):
    """Fill ``report``'s energy columns, ``perf_per_watt``, ``validation_flags``,
    ``energy_nodes``, ``host_facts`` and ``host_diffs`` from the normalized
    ``summary`` (and ``baseline``)."""
    tests = summary["tests"]
    have_energy = False
    for row in report.rows:
        e = (tests.get(row["test"]) or {}).get("energy")
        if not e:
            continue
        have_energy = True
        row["W"] = (e.get("power_w") or {}).get("mean")
        row["J/item"] = e.get("j_per_item")
        row["items/J"] = e.get("items_per_j")
        for node, figures in (e.get("pernode") or {}).items():
            report.energy_nodes.append({"test": row["test"], "node": node, **figures})
    if have_energy:
        report.columns += list(ENERGY_COLUMNS)
    scored = [r for r in report.rows if r["counted"] and r.get("items/J")]
    report.perf_per_watt_tests = len(scored)
    report.perf_per_watt = geomean_or_warn(
        report, [r["items/J"] for r in scored], [r["weight"] for r in scored], "perf/W"
    )
    for group, t in tests.items():
        for flag in t.get("validation_flags") or []:
            report.validation_flags.append((group, from_summary(flag)))
    report.host_facts = [
        (h.get("hostname"), hostfacts.fact_lines(h)) for h in summary.get("hosts") or []
    ]
    if baseline is not None:
        report.host_diffs = hostfacts.differences(summary, baseline)
    return report


def perf_per_watt_line(report):
    """The score block's ``perf/W`` line."""
    if report.perf_per_watt is None:
        return (
            "perf/W: not available (no GPU energy or power readings over the scored "
            "tests' steady states)"
        )
    return (
        f"perf/W: {fmt_num(report.perf_per_watt, '.4g')} items/J (weighted geometric mean "
        f"of items/J over {report.perf_per_watt_tests} scored test(s) with energy readings)"
    )


def flag_line(test, flag):
    """One flag of test ``test`` as a text line (a
    :class:`~milarun.measure.flags.Flag`, of either family). A validation flag:
    ``test run R device D[ node N]: check: message``; an anomaly: ``test kind:
    [node N ]device D[ run R]: message`` (the layouts the two report sections have
    always had)."""
    if flag.family == VALIDATION:
        where = f"run {flag.run} device {flag.device}"
        if flag.node:
            where += f" node {flag.node}"
        return f"{test} {where}: {flag.id}: {flag.message}"
    return f"{test} {flag.id}: {flag.who()}: {flag.message}"


def flag_html(test, flag):
    """One flag of test ``test`` as HTML (Markup): a validation flag is a row of the
    validation table (test, run, device, node, check, message), an anomaly an item
    of its test's list (``<b>kind</b>: [node N ]device D[ run R]: message``)."""
    from markupsafe import Markup, escape  # lazy: the text report needs no markupsafe

    if flag.family == VALIDATION:
        return Markup(
            f'<tr><td class="test">{escape(test)}</td><td>{escape(flag.run)}</td>'
            f"<td>{escape(flag.device)}</td><td>{escape(flag.node or '')}</td>\n"
            f'  <td class="bad">{escape(flag.id)}</td>'
            f'<td class="test">{escape(flag.message)}</td></tr>'
        )
    return Markup(
        f"<li><b>{escape(flag.id)}</b>: {escape(flag.who())}: {escape(flag.message)}</li>"
    )


def diff_line(diff):
    """One host fact that differs from the baseline's (the facts are a vendor's strings:
    terminal controls, newlines included, shown escaped:
    :func:`milarun.formats.terminal.one_line`, since ``make_report`` prints this line
    as a warning)."""
    words, ours, base = diff
    return one_line(f"{words}: {ours} (baseline: {base})")


def text_lines(report):
    """The report's validation, energy and host-fact sections as text lines
    (empty when there is nothing to say)."""
    lines = []
    if report.host_diffs:
        lines += ["", "host facts differ from the baseline's (results may not be comparable):"]
        lines += [f"  {diff_line(d)}" for d in report.host_diffs]
    if report.validation_flags:
        lines += ["", "validation flags (counted in the score; see docs/report.md):"]
        lines += [f"  {flag_line(test, f)}" for test, f in report.validation_flags]
    if report.energy_nodes:
        lines += [
            "",
            "energy per node over the steady states (W: the node's results of one "
            "run summed, mean over runs):",
        ]
        lines += [
            f"  {e['test']} {e['node']}: {fmt_num(e.get('power_w'), '.1f')} W, "
            f"{fmt_num(e.get('j_per_item'), '.4g')} J/item"
            for e in report.energy_nodes
        ]
    return lines


def header_lines(report):
    """The host-fact lines under the header's host lines (one per host that has facts)."""
    return [
        f"host facts ({name}): {' | '.join(parts)}" for name, parts in report.host_facts if parts
    ]


def energy_plot_rows(report):
    """``[(row number, items/J)]`` of the tests with energy, numbered as in the
    HTML energy table (no test name enters the SVG)."""
    return [(i + 1, r["items/J"]) for i, r in enumerate(r for r in report.rows if r.get("items/J"))]
