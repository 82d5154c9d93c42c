"""One flag model for the validation flags and the anomalies of a result.

A *flag* says that a result, or a result among its group, looks wrong; it is
shown, never scored. Two modules raise them:
:mod:`milarun.measure.plausibility` (the ``"validation"`` family: means over
the steady state against the job's thresholds) and
:mod:`milarun.measure.anomalies` (the ``"anomaly"`` family: the shape of the
samples, and the outliers of a group). Both build :class:`Flag` values with
:func:`flag`; :data:`RULES` holds one :class:`Rule` per check id.

The GPU health findings of a record (its ``health`` field, read by the launcher:
:mod:`milarun.host.health`) are flags too, of the ``"validation"`` family, through
:data:`HEALTH_RULES` and :func:`health_flags`: ``gpu-health-error`` (severity
:data:`ERROR`: the GPU fails) and ``gpu-health-warning``. They are kept apart from
:data:`RULES`, the checks of the two modules above, and :func:`rule_of` finds either.

The summary file keeps its two lists (``tests[g].validation_flags`` and
``tests[g].anomalies``, whose shapes the summary schema fixes):
:func:`to_summary` writes a flag in its family's shape and
:func:`from_summary` reads one back, so the analysis writes and the report
reads through these two functions only. The report renders a flag through one
text function and one HTML function (:mod:`milarun.report.checks`).

Pure code: no I/O, nothing heavy imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

VALIDATION = "validation"
ANOMALY = "anomaly"
#: Where a rule looks: one result, or a result among the others of its group.
RESULT = "result"
GROUP = "group"
#: The flags of :data:`RULES` are warnings: shown beside the result, never scored (the
#: checks that fail a result are failures, ``error.reason``, not flags).
WARNING = "warning"
#: A GPU health finding that fails the GPU (:data:`HEALTH_RULES`): shown as an error.
ERROR = "error"


@dataclass(frozen=True)
class Rule:
    """One check that raises flags."""

    id: str
    family: str  # VALIDATION or ANOMALY
    severity: str  # WARNING or ERROR
    scope: str  # RESULT or GROUP
    description: str


RULES = {
    r.id: r
    for r in (
        Rule(
            "gpu-load",
            VALIDATION,
            WARNING,
            RESULT,
            "a GPU's mean load over the steady state is below gpu_load_threshold",
        ),
        Rule(
            "gpu-memory",
            VALIDATION,
            WARNING,
            RESULT,
            "a GPU's mean memory used over its total is below gpu_mem_threshold",
        ),
        Rule(
            "host-busy",
            VALIDATION,
            WARNING,
            RESULT,
            "host CPUs busy outside the suite, as a fraction of the host's CPUs, above "
            "outside_cpu_threshold",
        ),
        Rule(
            "cpu-steal",
            VALIDATION,
            WARNING,
            RESULT,
            "steal time, as a fraction of the host's CPUs, above steal_threshold",
        ),
        Rule(
            "loss-not-decreasing",
            VALIDATION,
            WARNING,
            RESULT,
            "the training loss at the end is not below that of the first windows",
        ),
        Rule(
            "slow-windows",
            ANOMALY,
            WARNING,
            RESULT,
            "non-warm-up windows under half the result's reference rate, 1 s or more in all",
        ),
        Rule(
            "stall",
            ANOMALY,
            WARNING,
            RESULT,
            "no window closed for more than max(10 median window durations, 2 s)",
        ),
        Rule(
            "short-steady",
            ANOMALY,
            WARNING,
            RESULT,
            "the steady state is shorter than the test's rule",
        ),
        Rule(
            "outlier",
            ANOMALY,
            WARNING,
            GROUP,
            "a result's rate is off the median of the other results of its group",
        ),
    )
}

#: The GPU health checks (:mod:`milarun.host.health`): one per severity of a finding.
HEALTH_RULES = {
    r.id: r
    for r in (
        Rule(
            "gpu-health-error",
            VALIDATION,
            ERROR,
            RESULT,
            "a GPU health counter that fails the GPU went up during the launch (uncorrected "
            "ECC errors, retired pages, row remapping failures, XID errors)",
        ),
        Rule(
            "gpu-health-warning",
            VALIDATION,
            WARNING,
            RESULT,
            "a GPU health counter went up during the launch (corrected ECC errors, PCIe "
            "replays, NVLink errors, thermal throttling), went backwards, or the PCIe link "
            "is narrower than its maximum",
        ),
    )
}
#: The check of a finding of each severity.
HEALTH_CHECKS = {ERROR: "gpu-health-error", WARNING: "gpu-health-warning"}


def rule_of(check: str) -> Rule | None:
    """The :class:`Rule` of ``check`` in :data:`RULES` or :data:`HEALTH_RULES`; None for an
    id this version does not know."""
    return RULES.get(check) or HEALTH_RULES.get(check)


#: The keys that say where a flag is: which result (``device``, ``node``, ``run``,
#: ``file``) and, for a GPU check, which ``gpu``.
WHERE = ("device", "node", "run", "file", "gpu")


@dataclass(frozen=True)
class Flag:
    """One flag: its check ``id`` (a key of :data:`RULES`), its ``family``, its
    ``message`` (the sentence of the check, without naming the result), ``where``
    (the keys of :data:`WHERE` that are known) and ``figures`` (the check's numbers,
    in their order on disk). ``subject`` replaces the result's name when the flag
    stands for several results (:func:`milarun.measure.anomalies.merged`)."""

    id: str
    family: str
    message: str
    where: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    subject: str | None = None

    @property
    def rule(self) -> Rule | None:
        """The :class:`Rule` of the check (None for an id this version does not know,
        read from a summary)."""
        return rule_of(self.id)

    @property
    def severity(self) -> str:
        return self.rule.severity if self.rule else WARNING

    @property
    def scope(self) -> str:
        return self.rule.scope if self.rule else RESULT

    @property
    def device(self) -> Any:
        return self.where.get("device")

    @property
    def node(self) -> Any:
        return self.where.get("node")

    @property
    def run(self) -> Any:
        return self.where.get("run")

    @property
    def file(self) -> Any:
        return self.where.get("file")

    @property
    def gpu(self) -> Any:
        return self.where.get("gpu")

    def at(self, **where: Any) -> Flag:
        """The flag with ``where`` keys added (or replaced)."""
        return replace(self, where={**self.where, **where})

    def without(self, *figures: str) -> Flag:
        """The flag less the named figures."""
        return replace(self, figures={k: v for k, v in self.figures.items() if k not in figures})

    def who(self) -> str:
        """The result the flag is about: ``[node N ]device D[ run R]`` (or its
        ``subject``)."""
        if self.subject is not None:
            return self.subject
        node = f"node {self.node} " if self.node else ""
        run = f" run {self.run}" if self.run is not None else ""
        return f"{node}device {self.device}{run}"

    def as_dict(self) -> dict[str, Any]:
        """The flag as the summary holds it (:func:`to_summary`)."""
        return to_summary(self)


def flag(
    check: str,
    message: str | None = None,
    where: Mapping[str, Any] | None = None,
    **figures: Any,
) -> Flag:
    """A :class:`Flag` of check ``check`` (a key of :data:`RULES` or :data:`HEALTH_RULES`;
    KeyError for another). ``message`` is
    the check's sentence; without one (the anomaly checks) it is made from the
    figures, as :func:`from_summary` makes it again."""
    rule = rule_of(check)
    if rule is None:
        raise KeyError(check)
    where = dict(where or {})
    if message is None:
        message = _text(check, figures)
    return Flag(check, rule.family, message, where, dict(figures))


def health_flags(record: Mapping[str, Any]) -> list[Flag]:
    """The flags of the GPU health findings of ``record`` (its ``health.findings``,
    :func:`milarun.host.health.diff`): one per finding, ``gpu-health-error`` or
    ``gpu-health-warning`` by its severity, at its ``gpu`` (the NVML index), with
    ``value``: how much the counter went up (None when it went backwards or is a state);
    for a PCIe link narrower than its maximum, ``value`` and ``threshold`` are the two
    widths (lanes). The message names the GPU and the counter. A record without
    ``health`` (CPU slots, records before format 12) has none."""
    health = record.get("health")
    if not isinstance(health, dict):
        return []
    out: list[Flag] = []
    for f in health.get("findings") or []:
        if not isinstance(f, dict) or f.get("severity") not in HEALTH_CHECKS:
            continue
        gpu, before, after = f.get("gpu"), f.get("before"), f.get("after")
        figures: dict[str, Any] = {}
        if f.get("counter") == "pcie_width" and _count(after):
            widest = _counters_of(health, gpu).get("pcie_width_max")
            figures = {"value": after, "threshold": widest if _count(widest) else None}
        elif isinstance(before, int) and isinstance(after, int) and 0 <= before <= after:
            figures = {"value": after - before}
        name = f"GPU {gpu}" if _count(gpu) else "a GPU"
        verdict = "the GPU fails" if f["severity"] == ERROR else "a warning"
        message = f"{name}: {f.get('message')}; {verdict}"
        where = {"gpu": gpu} if _count(gpu) else {}
        out.append(flag(HEALTH_CHECKS[f["severity"]], message, where, **figures))
    return out


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _counters_of(health: Mapping[str, Any], gpu: Any) -> Mapping[str, Any]:
    for g in health.get("gpus") or []:
        if isinstance(g, dict) and g.get("index") == gpu and isinstance(g.get("counters"), dict):
            return g["counters"]
    return {}


# ------------------------------------------------------------------ the summary's shapes


def to_summary(f: Flag) -> dict[str, Any]:
    """A flag as the summary file holds it: a ``validation_flags`` entry
    (``device``, ``node``, ``run``, ``check``, ``gpu``, ``value``, ``threshold``,
    ``message``, ``file``, each when known) or an ``anomalies`` entry (``kind``,
    ``device``, ``run``, the figures, ``file``, ``node``)."""
    w = f.where
    out: dict[str, Any]
    if f.family == VALIDATION:
        out = {k: w[k] for k in ("device", "node", "run") if k in w}
        out["check"] = f.id
        if "gpu" in w:
            out["gpu"] = w["gpu"]
        out.update(f.figures)
        out["message"] = f.message
        if "file" in w:
            out["file"] = w["file"]
        return out
    out = {"kind": f.id, **{k: w[k] for k in ("device", "run") if k in w}, **f.figures}
    out.update({k: w[k] for k in ("file", "node") if k in w})
    return out


def from_summary(entry: Mapping[str, Any]) -> Flag:
    """The :class:`Flag` of a summary's ``validation_flags`` entry (it has
    ``check``) or ``anomalies`` entry (it has ``kind``)."""
    where = {k: entry[k] for k in WHERE if k in entry}
    if "check" in entry:
        figures = {
            k: v for k, v in entry.items() if k not in WHERE and k not in ("check", "message")
        }
        message: Any = entry.get("message")  # as the summary holds it
        return Flag(entry["check"], VALIDATION, message, where, figures)
    figures = {k: v for k, v in entry.items() if k not in WHERE and k != "kind"}
    kind: Any = entry.get("kind")
    return Flag(kind, ANOMALY, _text(kind, figures), where, figures)


# ------------------------------------------------------------------ anomaly sentences


def _text(check: str, fig: Mapping[str, Any]) -> str:
    """The sentence of an anomaly flag, from its figures (the module doc of
    :mod:`milarun.measure.anomalies` has the rules)."""
    if check == "slow-windows":
        where = (
            f"{fig['in_steady']} of them in the steady-state samples, lowering the rate"
            if fig.get("in_steady")
            else "none in the steady-state samples"
        )
        best = fig.get("best")
        ref = (
            f"the best sustained rate {best:.4g} items/s (steady-state median {fig['median']:.4g})"
            if best is not None and best > fig["median"]
            else f"the steady-state median {fig['median']:.4g} items/s"
        )
        return (
            f"{fig['windows']} window(s), {fig['seconds']:.1f} s from "
            f"t={fig['first']:.1f} to {fig['last']:.1f} s, under half of {ref}; "
            f"lowest {fig['lowest']:.4g}; {where}"
        )
    if check == "stall":
        more = f" ({fig['count']} stalls)" if fig.get("count", 1) > 1 else ""
        end = " until it ended" if fig.get("at_end") else ""
        return (
            f"no window closed for {fig['seconds']:.1f} s, from t="
            f"{fig['start']:.1f} to {fig['end']:.1f} s{end}{more}; a stall is over "
            f"{fig['threshold']:.1f} s"
        )
    if check == "short-steady":
        rule = (
            "the test declared (--min-steady)"
            if fig.get("rule") == "min-steady"
            else "of the steady-state rule (10 s window + 1 s tail; the test declared "
            "no --min-steady)"
        )
        return (
            f"{fig['steady_s']:.1f} s of steady state, less than the {fig['required_s']:g} s {rule}"
        )
    if check == "outlier":
        pct = abs(1 - fig["ratio"]) * 100
        side = "below" if fig.get("direction") == "low" else "above"
        ref = (
            "the other result of the test"
            if fig.get("others") == 1
            else f"the median of the {fig.get('others')} other results of the test"
        )
        return f"{fig['rate']:.4g} items/s, {pct:.0f}% {side} {ref} ({fig['ref']:.4g})"
    return f"{check}"
