"""Number formatting and out-of-range guards shared by the report's modules.

Leaf of the report package: :mod:`.table`, :mod:`.checks`, :mod:`.text` and
:mod:`.html` import it, it imports none of them.
"""

from ..measure import stats


def fmt_num(value, spec=".2f"):
    """Format a number, or ``-`` for ``None``."""
    if value is None:
        return "-"
    return format(value, spec)


def fmt_pct(value):
    """Format a fraction as a percentage with two decimals."""
    return "-" if value is None else f"{value * 100:.2f}%"


def finite_or_warn(report, value, what):
    """``value``, or None (shown "n/a") when it is not a finite number, with a line
    naming ``what`` added to ``report.warnings`` (``report`` None: no line)."""
    if value is None or stats.finite(value):
        return value
    if report is not None:
        report.warnings.append(f"{what} is out of range ({value!r}): shown as n/a")
    return None


def geomean_or_warn(report, values, weights, what):
    """:func:`milarun.measure.stats.weighted_geomean` of ``values``, or None with a warning in
    ``report`` when it is out of range or its inputs are refused."""
    try:
        value = stats.weighted_geomean(values, weights)
    except ValueError as exc:
        report.warnings.append(f"{what}: {exc}: shown as n/a")
        return None
    return finite_or_warn(report, value, what)
