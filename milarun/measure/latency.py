"""Serving latency: TTFT, TPOT, percentiles and goodput of generation batches (pure).

Definitions (as vLLM's ``benchmark_serving`` and MLPerf Inference state them):

* **TTFT**, time to first token (s): from a request's arrival (here, the
  start of its batch) to its first generated token: queueing, prefill of the
  prompt and the first decoding step.
* **TPOT**, time per output token (s): the decoding time after the first
  token divided by the tokens after the first, ``(t_last − t_first) /
  (output_tokens − 1)``; undefined for a single output token.
* **Goodput** (requests/s): requests that met both latency bounds (TTFT ≤
  ``ttft_slo_s`` and TPOT ≤ ``tpot_slo_s``) per second of serving; MLPerf
  Inference's server scenario states its LLM constraints this way (Llama 2
  70B: TTFT ≤ 2 s, TPOT ≤ 200 ms).
* Prefill tokens/s: prompt tokens of the batch ÷ its TTFT. Decode tokens/s:
  output tokens after the first ÷ the decoding time. Output tokens/s: every
  output token ÷ the batch's whole time (the throughput a user sees).

Percentiles use the nearest-rank method (the smallest value with at least
``p`` % of the values at or below it): no interpolated latency that no
request had.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


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


__all__ = ["percentile", "batch_latency", "serving_level"]
