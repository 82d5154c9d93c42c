"""Serving latency: TTFT, TPOT, percentiles and goodput (pure: no I/O, stdlib only).

Two sources of figures:

* :func:`batch_latency` and :func:`serving_level` — static generation batches timed
  as a whole (every request of a batch shares its times).
* :func:`level_figures` — one load level of an OpenAI-compatible server, recomputed
  from the raw per-request timings a load generator recorded (the one definition
  the workload, the summary and ``verify`` share).

Definitions (as vLLM's ``benchmarks/benchmark_serving.py`` / ``vllm bench serve``,
NVIDIA GenAI-Perf / AIPerf's metric documentation and the MLPerf Inference LLM
rules state them):

* **TTFT**, time to first token (s): from a request's send (for a static batch,
  the start of its batch) to its first generated token (first content chunk):
  queueing, prefill of the prompt and the first decoding step.
* **E2E** (request latency, s): from a request's send to the end of its response.
* **TPOT**, time per output token (s): the decoding time after the first
  token divided by the tokens after the first, ``(e2e − ttft) /
  (output_tokens − 1)`` (vLLM's ``tpot``, GenAI-Perf's "inter token latency"
  per request); undefined for a single output token.
* **ITL**, inter-token latency (s): each gap between successive content chunks
  of a response, pooled over requests (vLLM's ``itl``).
* Per-user output tokens/s: ``1 / TPOT`` of a request, the speed one user sees
  (the "interactivity" axis of throughput-vs-interactivity curves, as
  InferenceX / SemiAnalysis plot them); a level reports the median over requests.
* **Goodput** (requests/s): requests that met both latency bounds (TTFT ≤
  ``ttft_slo_s`` and TPOT ≤ ``tpot_slo_s``, a single-token request meeting the
  TPOT bound) per second of serving: vLLM's ``--goodput``, after DistServe
  (Zhong et al., OSDI 2024).
* **SLO met**: MLPerf Inference's server-scenario test of an LLM: the p99 TTFT
  and the p99 TPOT within their bounds (Llama 2 70B: TTFT ≤ 2 s, TPOT ≤ 200 ms;
  :data:`TARGETS`), and here no failed request.
* Prefill tokens/s: prompt tokens of the batch ÷ its TTFT. Decode tokens/s:
  output tokens after the first ÷ the decoding time. Output tokens/s: every
  output token ÷ the batch's whole time (the throughput a user sees).

Percentiles use the nearest-rank method (the smallest value with at least
``p`` % of the values at or below it): no interpolated latency that no
request had.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any, TypeGuard


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank ``p``-th percentile (0 < p ≤ 100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def batch_latency(
    start: float,
    first: float,
    last: float,
    prompt_tokens: int,
    requests: int,
    output_tokens: int,
) -> dict[str, float | None]:
    """One static batch of ``requests`` generated together.

    Args:
        start, first, last: times (s, one clock) of the batch's start, of its
            first generated token and of its last.
        prompt_tokens: prompt tokens of the whole batch (padding excluded).
        requests: requests in the batch.
        output_tokens: tokens generated per request.

    Returns:
        dict with ``ttft_s``, ``tpot_s`` (None for one output token),
        ``prefill_tokens_per_s``, ``decode_tokens_per_s`` (None for one output
        token), ``output_tokens_per_s`` and ``duration_s``.

    Raises:
        ValueError: times out of order, or counts below 1.
    """
    if not start <= first <= last:
        raise ValueError(f"batch times out of order: start {start}, first {first}, last {last}")
    if requests < 1 or output_tokens < 1 or prompt_tokens < 0:
        raise ValueError("a batch needs at least one request and one output token")
    ttft = first - start
    decode = last - first
    tpot = decode / (output_tokens - 1) if output_tokens > 1 else None
    total = last - start
    return {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "prefill_tokens_per_s": prompt_tokens / ttft if ttft > 0 else None,
        "decode_tokens_per_s": (
            requests * (output_tokens - 1) / decode if output_tokens > 1 and decode > 0 else None
        ),
        "output_tokens_per_s": requests * output_tokens / total if total > 0 else None,
        "duration_s": total,
    }


def serving_level(
    concurrency: int,
    batches: Iterable[dict[str, Any]],
    ttft_slo_s: float,
    tpot_slo_s: float,
) -> dict[str, Any]:
    """Summary of one concurrency level from its batches' :func:`batch_latency` results,
    each with ``requests``, ``prompt_tokens`` and ``output_tokens`` added.

    Every request of a static batch has the batch's TTFT and TPOT. Returns a
    dict of ``concurrency``, ``requests``, TTFT and TPOT p50/p90/p99 and means (s),
    prefill/decode/output tokens/s over the level (sums of tokens ÷ sums of
    times), ``goodput_requests_per_s`` and ``goodput_fraction``.
    """
    ttft: list[float] = []
    tpot: list[float] = []
    good = 0
    prompt = decode_tok = out_tok = 0
    t_ttft = t_decode = t_total = 0.0
    requests = 0
    for b in batches:
        n = b["requests"]
        requests += n
        ttft += [b["ttft_s"]] * n
        if b["tpot_s"] is not None:
            tpot += [b["tpot_s"]] * n
        ok = b["ttft_s"] <= ttft_slo_s and (b["tpot_s"] is None or b["tpot_s"] <= tpot_slo_s)
        good += n if ok else 0
        prompt += b["prompt_tokens"]
        t_ttft += b["ttft_s"]
        decode_tok += n * (b["output_tokens"] - 1)
        t_decode += b["duration_s"] - b["ttft_s"]
        out_tok += n * b["output_tokens"]
        t_total += b["duration_s"]
    level: dict[str, Any] = {"concurrency": concurrency, "requests": requests}
    for name, values in (("ttft", ttft), ("tpot", tpot)):
        for p in (50, 90, 99):
            level[f"{name}_p{p}_s"] = percentile(values, p)
    level["ttft_mean_s"] = sum(ttft) / len(ttft) if ttft else None
    level["tpot_mean_s"] = sum(tpot) / len(tpot) if tpot else None
    level["prefill_tokens_per_s"] = prompt / t_ttft if t_ttft > 0 else None
    level["decode_tokens_per_s"] = decode_tok / t_decode if t_decode > 0 else None
    level["output_tokens_per_s"] = out_tok / t_total if t_total > 0 else None
    level["goodput_requests_per_s"] = good / t_total if t_total > 0 else None
    level["goodput_fraction"] = good / requests if requests else None
    return level


#: Latency targets ``{name: (ttft_s, tpot_s)}``, each bound on the p99 of its figure: the
#: server and interactive scenarios of the LLM benchmarks in the MLPerf Inference rules
#: (mlcommons/inference_policies, ``inference_rules.adoc``, v5.x, the latency
#: constraints of the LLM benchmarks).
TARGETS: dict[str, tuple[float, float]] = {
    # MLPerf Inference v5.x rules, Llama 3.1 8B, Server: TTFT p99 ≤ 2 s, TPOT p99 ≤ 100 ms.
    "llama3.1-8b-server": (2.0, 0.100),
    # MLPerf Inference v5.x rules, Llama 3.1 8B, Interactive: TTFT p99 ≤ 0.5 s, TPOT ≤ 30 ms.
    "llama3.1-8b-interactive": (0.5, 0.030),
    # MLPerf Inference v5.x rules, Llama 2 70B, Server: TTFT p99 ≤ 2 s, TPOT p99 ≤ 200 ms.
    "llama2-70b-server": (2.0, 0.200),
    # MLPerf Inference v5.x rules, Llama 2 70B, Interactive: TTFT p99 ≤ 450 ms, TPOT ≤ 40 ms.
    "llama2-70b-interactive": (0.45, 0.040),
    # MLPerf Inference v5.x rules, Llama 3.1 405B, Server: TTFT p99 ≤ 6 s, TPOT p99 ≤ 175 ms.
    "llama3.1-405b-server": (6.0, 0.175),
    # MLPerf Inference v5.x rules, Llama 3.1 405B, Interactive: TTFT p99 ≤ 4.5 s, TPOT ≤ 80 ms.
    "llama3.1-405b-interactive": (4.5, 0.080),
}


def targets(name: str) -> tuple[float, float]:
    """The ``(ttft_s, tpot_s)`` p99 bounds (s) of the :data:`TARGETS` preset ``name``.

    Raises:
        ValueError: ``name`` is not a preset (the message lists the valid names).
    """
    if name not in TARGETS:
        raise ValueError(f"unknown latency target {name!r}; valid: {', '.join(sorted(TARGETS))}")
    return TARGETS[name]


#: The columns :func:`level_figures` reads; each a list with one entry per request.
COLUMNS = ("send_s", "ttft_s", "e2e_s", "prompt_tokens", "output_tokens", "itl_us", "error")

#: Longest failure reason kept (characters) and most distinct reasons kept; the rest of
#: the failures are counted under ``"other"``, so that a hostile record cannot grow a
#: summary without bound.
REASON_CHARS = 64
REASONS_KEPT = 16


def _show(value: object) -> str:
    """A short one-line ``repr`` of a bad value for an error message."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _time(value: object, where: str, optional: bool) -> float | None:
    """``value`` as a finite non-negative time (s); None allowed when ``optional``."""
    if value is None and optional:
        return None
    if not _is_number(value):
        raise ValueError(f"{where}: expected a number of seconds, got {_show(value)}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{where}: expected a finite time >= 0 s, got {_show(value)}")
    return number


def _checked_columns(columns: object, warmup: object) -> int:
    """Check the columns' presence, lengths and every value's type and range.

    Returns the number of requests. Raises ValueError naming the column (and index).
    """
    if not isinstance(columns, dict):
        raise ValueError(f"columns: expected a dict of lists, got {type(columns).__name__}")
    length: int | None = None
    for name in COLUMNS:
        if name not in columns:
            raise ValueError(f"{name}: column missing")
        col = columns[name]
        if not isinstance(col, (list, tuple)):
            raise ValueError(f"{name}: expected a list, got {type(col).__name__}")
        if length is None:
            length = len(col)
        elif len(col) != length:
            raise ValueError(f"{name}: {len(col)} values where send_s has {length}")
    n = length or 0
    for i in range(n):
        _time(columns["send_s"][i], f"send_s[{i}]", optional=False)
        ttft = _time(columns["ttft_s"][i], f"ttft_s[{i}]", optional=True)
        e2e = _time(columns["e2e_s"][i], f"e2e_s[{i}]", optional=True)
        if ttft is not None and e2e is not None and ttft > e2e:
            raise ValueError(f"ttft_s[{i}]: first token at {ttft} s after the end at {e2e} s")
        prompt = columns["prompt_tokens"][i]
        if prompt is not None and not _is_count(prompt):
            raise ValueError(f"prompt_tokens[{i}]: expected an integer >= 0, got {_show(prompt)}")
        if not _is_count(columns["output_tokens"][i]):
            got = _show(columns["output_tokens"][i])
            raise ValueError(f"output_tokens[{i}]: expected an integer >= 0, got {got}")
        gaps = columns["itl_us"][i]
        if not isinstance(gaps, (list, tuple)):
            raise ValueError(f"itl_us[{i}]: expected a list of integers (µs), got {_show(gaps)}")
        for j, gap in enumerate(gaps):
            if not _is_count(gap):
                raise ValueError(f"itl_us[{i}][{j}]: expected an integer >= 0 µs, got {_show(gap)}")
        error = columns["error"][i]
        if error is not None and not isinstance(error, str):
            raise ValueError(f"error[{i}]: expected a string or None, got {_show(error)}")
    if not isinstance(warmup, int) or isinstance(warmup, bool) or not 0 <= warmup <= n:
        raise ValueError(f"warmup: expected an integer from 0 to {n}, got {_show(warmup)}")
    return n


def _check_slo(ttft_slo_s: object, tpot_slo_s: object, slo_percentile: object) -> None:
    for name, value in (("ttft_slo_s", ttft_slo_s), ("tpot_slo_s", tpot_slo_s)):
        if not _is_number(value) or not 0 < value < math.inf:
            raise ValueError(f"{name}: expected a finite time > 0 s, got {_show(value)}")
    if not _is_number(slo_percentile) or not 0 < slo_percentile <= 100:
        raise ValueError(f"slo_percentile: expected 0 < p <= 100, got {_show(slo_percentile)}")


def _failure_counts(reasons: Sequence[str]) -> dict[str, int]:
    """Count failure reasons, each cut to :data:`REASON_CHARS` characters; the
    :data:`REASONS_KEPT` most frequent are kept (ties: first seen first) and the
    others summed under ``"other"``."""
    counts: dict[str, int] = {}
    for reason in reasons:
        key = reason[:REASON_CHARS]
        counts[key] = counts.get(key, 0) + 1
    # sorted() is stable: equal counts keep their first-seen order.
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    kept = dict(ranked[:REASONS_KEPT])
    rest = sum(count for _, count in ranked[REASONS_KEPT:])
    if rest:
        kept["other"] = kept.get("other", 0) + rest
    return kept


def _summary(name: str, values: Sequence[float], figures: dict[str, Any]) -> None:
    """Add ``<name>_p50_s``, ``_p90_s``, ``_p99_s`` and ``_mean_s`` (None when empty)."""
    for p in (50, 90, 99):
        figures[f"{name}_p{p}_s"] = percentile(values, p)
    figures[f"{name}_mean_s"] = sum(values) / len(values) if values else None


def _rate(amount: float, duration: float | None) -> float | None:
    """``amount`` per second of ``duration``; None when the window is unknown or empty."""
    return amount / duration if duration else None


def level_figures(
    columns: dict[str, list[Any]],
    warmup: int,
    ttft_slo_s: float,
    tpot_slo_s: float,
    slo_percentile: float = 99.0,
) -> dict[str, Any]:
    """Request-level figures of one load level, recomputed from its raw request timings.

    Args:
        columns: ``{column: list}``, all lists of one length ``n`` (one entry per
            request, in send order, warm-up requests first): ``send_s`` (s from the
            level's start), ``ttft_s`` (s after the send, None when no token came),
            ``e2e_s`` (s from the send to the response's end, None when it never
            ended), ``prompt_tokens`` (int or None), ``output_tokens`` (int, tokens
            received), ``itl_us`` (list of int: gaps between successive content
            chunks, µs) and ``error`` (None when it succeeded, else a short reason).
            Other keys are ignored.
        warmup: the first ``warmup`` requests are not measured (0 ≤ warmup ≤ n).
        ttft_slo_s, tpot_slo_s: latency bounds (s) of goodput and of ``slo_met``.
        slo_percentile: the percentile (0 < p ≤ 100) of TTFT and TPOT that
            ``slo_met`` holds to the bounds (MLPerf: 99).

    Definitions (module docstring for the sources):

    * measured requests: those after the first ``warmup``; window: from the earliest
      send of a measured request (the first, the columns being in send order) to the
      latest ``send_s + e2e_s`` of the measured requests, failed ones included;
      ``duration_s`` its length (None when no measured request ended).
    * succeeded: ``error`` None, ``ttft_s`` and ``e2e_s`` known and ≥ 1 output token.
      A failure's reason is its ``error``, else ``"no token"`` (no first token or no
      output token) or ``"no end"`` (no ``e2e_s``).
    * TTFT, E2E of each successful request; TPOT ``(e2e − ttft) / (output_tokens − 1)``
      of those with ≥ 2 output tokens; ITL every gap of their ``itl_us``, in s.
    * rates divide by ``duration_s``: completed requests, prompt tokens of completed
      requests (an unknown count taken as 0, and ``input_tokens_known`` False),
      output tokens of every measured request (failed ones included: the server
      produced them).
    * per user: the median (mean of the two middle values for an even count) of
      ``1 / TPOT``; a zero TPOT (all tokens in one instant) has no finite rate and
      is left out.
    * good request: succeeded, TTFT ≤ ``ttft_slo_s``, and TPOT ≤ ``tpot_slo_s`` or a
      single output token. ``goodput_fraction`` = good / measured requests.
    * ``slo_met``: the ``slo_percentile`` TTFT ≤ ``ttft_slo_s``, that TPOT ≤
      ``tpot_slo_s`` (no TPOT counts as met), no failed request and at least one
      successful request.

    Returns:
        dict of ``requests``, ``completed``, ``failed``, ``failures`` (reason ->
        count), ``window_start_s``, ``window_end_s``, ``duration_s`` (s); ``ttft``,
        ``tpot``, ``itl`` and ``e2e`` each as ``<name>_p50_s``, ``_p90_s``,
        ``_p99_s``, ``_mean_s`` (s, None without a value); ``ttft_at_slo_percentile_s``
        and ``tpot_at_slo_percentile_s`` (s); ``request_throughput`` (requests/s),
        ``input_tokens_per_s``, ``input_tokens_known``, ``output_tokens_per_s``,
        ``output_tokens_per_s_per_user`` (tokens/s); ``goodput_requests_per_s``
        (requests/s), ``goodput_tokens_per_s`` (tokens/s), ``goodput_fraction``;
        ``slo_met``, ``slo_percentile``, ``ttft_slo_s``, ``tpot_slo_s``, ``warmup``.
        Rates are None when the window is unknown or lasts 0 s.

    Raises:
        ValueError: one line naming the column (or argument): a column missing or
            not a list, columns of different lengths, a value of the wrong type (a
            bool is not a number), a negative, NaN or infinite number, a TTFT after
            the response's end, ``warmup`` outside 0..n, or a bound not > 0.
    """
    n = _checked_columns(columns, warmup)
    _check_slo(ttft_slo_s, tpot_slo_s, slo_percentile)
    measured = range(warmup, n)
    send = columns["send_s"]
    ends = [send[i] + columns["e2e_s"][i] for i in measured if columns["e2e_s"][i] is not None]
    start = min((send[i] for i in measured), default=None)
    end = max(ends, default=None)
    duration = end - start if start is not None and end is not None else None

    ttft: list[float] = []
    e2e: list[float] = []
    tpot: list[float] = []
    itl: list[float] = []
    reasons: list[str] = []
    good = good_tokens = prompt_tokens = output_tokens = 0
    prompt_known = True
    for i in measured:
        out = columns["output_tokens"][i]
        output_tokens += out
        first, last, error = columns["ttft_s"][i], columns["e2e_s"][i], columns["error"][i]
        if error is not None or first is None or last is None or out < 1:
            no_token = first is None or out < 1
            reasons.append(error if error is not None else "no token" if no_token else "no end")
            continue
        ttft.append(first)
        e2e.append(last)
        itl += [gap / 1e6 for gap in columns["itl_us"][i]]
        prompt = columns["prompt_tokens"][i]
        prompt_known = prompt_known and prompt is not None
        prompt_tokens += prompt or 0
        per_token = (last - first) / (out - 1) if out > 1 else None
        if per_token is not None:
            tpot.append(per_token)
        if first <= ttft_slo_s and (per_token is None or per_token <= tpot_slo_s):
            good += 1
            good_tokens += out

    requests, completed = len(measured), len(ttft)
    figures: dict[str, Any] = {
        "requests": requests,
        "completed": completed,
        "failed": len(reasons),
        "failures": _failure_counts(reasons),
        "window_start_s": start,
        "window_end_s": end,
        "duration_s": duration,
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        _summary(name, values, figures)
    ttft_at = percentile(ttft, slo_percentile)
    tpot_at = percentile(tpot, slo_percentile)
    per_user = [1 / t for t in tpot if t > 0]
    figures.update(
        ttft_at_slo_percentile_s=ttft_at,
        tpot_at_slo_percentile_s=tpot_at,
        request_throughput=_rate(completed, duration),
        input_tokens_per_s=_rate(prompt_tokens, duration),
        input_tokens_known=prompt_known,
        output_tokens_per_s=_rate(output_tokens, duration),
        output_tokens_per_s_per_user=statistics.median(per_user) if per_user else None,
        goodput_requests_per_s=_rate(good, duration),
        goodput_tokens_per_s=_rate(good_tokens, duration),
        goodput_fraction=good / requests if requests else None,
        slo_met=(
            ttft_at is not None
            and ttft_at <= ttft_slo_s
            and (tpot_at is None or tpot_at <= tpot_slo_s)
            and not reasons
        ),
        slo_percentile=slo_percentile,
        ttft_slo_s=ttft_slo_s,
        tpot_slo_s=tpot_slo_s,
        warmup=warmup,
    )
    return figures


__all__ = [
    "percentile",
    "batch_latency",
    "serving_level",
    "level_figures",
    "TARGETS",
    "targets",
    "COLUMNS",
]
