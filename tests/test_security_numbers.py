"""Security, numbers and strings: a vendor's numbers cannot break or inflate the score, and a
vendor's strings cannot drive the buyer's terminal.

Each test feeds one hostile input (weights of 1e308, a record at 1.5e308 items/s, a
sample that ends before it starts, a baseline of 5e-324 items/s, ``--price inf``, an
escape sequence in an error message) and checks what the buyer sees: one line naming
the file and key with exit 2, or a skipped record with one warning line and the rest
of the report, never a traceback, NaN or inf.
"""

import io
import json
import math
import re
import shutil
from pathlib import Path

import pytest
from conftest import cli

from milarun.analysis.summary import summarize_dir
from milarun.cli.report import run_report
from milarun.formats.summary import normalize_summary
from milarun.formats.terminal import terminal_safe
from milarun.measure import stats
from milarun.report import build_report, load_weights, render_text

ROOT = Path(__file__).parent.parent
RESULTS = Path(__file__).parent / "fixtures" / "results"
VAE = "standard.vae.J0.0.20261121-120004-000000.json"
VAE_FAIL = "standard.vae.J0.1.FAIL.20261121-120005-000000.json"


def results_copy(tmp_path, name=VAE, change=None):
    """A copy of the fixture results with record ``name`` changed by ``change(record)``."""
    folder = tmp_path / "results"
    shutil.copytree(RESULTS, folder)
    if change is not None:
        path = folder / name
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))
    return folder


def no_inf_or_nan(text):
    return not re.search(r"\b(inf|nan)\b", text, re.I)


def report_of(folder, **options):
    """``(exit code, text, warnings)`` of ``milarun report folder``."""
    out, err = io.StringIO(), io.StringIO()
    code = run_report(str(folder), stdout=out, warn=err, **options)
    return code, out.getvalue(), err.getvalue()


# --- weights ----------------------------------------------------------------------------


def test_weights_of_1e308_are_refused_naming_the_file_and_key(tmp_path, capsys):
    w = tmp_path / "w.json"
    w.write_text('{"standard.convnet": {"weight": 1e308}}')
    code, out, err = cli(["report", RESULTS, "--weights", w], capsys)
    assert (code, out) == (2, "")
    assert err == (
        f"milarun: error: {w}: standard.convnet.weight: weight must be at most "
        "1e6 (0 leaves a test out of the score), not 1e+308\n"
    )


@pytest.mark.parametrize("path", sorted((ROOT / "weights").glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_weights_file_is_within_the_bounds(path):
    weights = load_weights(path)
    assert all(0 <= w <= 1e6 for w in weights.values())


def test_the_score_is_the_weighted_geometric_mean_whatever_the_weights():
    # 1e308 * log(v) summed overflowed: the score was nan. The weights are normalized
    # first, and a common factor does not change a weighted mean.
    assert stats.weighted_geomean([2.0, 8.0], [1e308, 1e308]) == pytest.approx(4.0)
    assert stats.weighted_geomean([10.0, 1000.0], [1e-300, 3e-300]) == pytest.approx(10**2.5)
    assert stats.weighted_geomean([1e300, 1e300, 1e300], [1, 1, 1]) == pytest.approx(1e300)


# --- records ------------------------------------------------------------------------------


def _huge_rate(record):
    for s in record["timings"]["train"]["samples"]:
        s["rate"] = 1.5e308


def test_a_record_at_1_5e308_items_per_s_is_skipped_with_a_warning(tmp_path, capsys):
    folder = results_copy(tmp_path, change=_huge_rate)
    code, text, warn = report_of(folder, weights=None)
    assert code == 0 and "Traceback" not in warn
    assert (
        f"milarun: warning: skipped {folder / VAE}: timings.train.samples.0.rate: "
        "must be <= 1e+12, not 1.5e+308"
    ) in warn.splitlines()
    assert "standard.convnet" in text and "score: " in text
    assert no_inf_or_nan(text)
    code, out, err = cli(["summary", folder], capsys)
    assert code == 0 and "Traceback" not in err and f"skipped {folder / VAE}" in err
    assert json.loads(out)["tests"]["standard.convnet"]["train"]["n"] > 0


def test_a_rate_that_overflows_within_the_bounds_skips_the_record(tmp_path):
    # every count within 1e15 items, every time within 1e9 s, but 5e-324 s long: the rate
    # is count / duration = inf, which the summary used to sum (OverflowError)
    def tiny_samples(record):
        for s in record["timings"]["train"]["samples"]:
            if not s["warmup"]:
                s.update(count=1e15, start=0.0, end=5e-324)

    folder = results_copy(tmp_path, change=tiny_samples)
    code, text, warn = report_of(folder)
    assert code == 0 and "Traceback" not in warn
    line = next(w for w in warn.splitlines() if VAE in w)
    assert "steady-state rate" in line and "out of range (1e-09 to 1e+12)" in line
    assert no_inf_or_nan(text)


def test_a_sample_that_ends_before_it_starts_skips_its_record(tmp_path):
    def backwards(record):
        sample = record["timings"]["train"]["samples"][31]
        sample["end"] = sample["start"] - 0.9

    folder = results_copy(tmp_path, change=backwards)
    warn = io.StringIO()
    summary, _ = summarize_dir(folder, warn=warn)
    assert (
        f"milarun: warning: skipped {folder / VAE}: timings.train.samples.31: end 15.6 "
        "is before start 16.5"
    ) in warn.getvalue().splitlines()
    assert VAE in summary["skipped"]
    # the vae test keeps only its failed run: no rate, so nothing inflated
    assert summary["tests"]["standard.vae"]["train"]["n"] == 0


def test_steady_state_refuses_a_backwards_sample_even_in_the_warm_up():
    good = [{"start": 0.0, "end": 1.0, "count": 10.0, "rate": 10.0, "warmup": False}]
    assert stats.steady_state(good)[0] == 10.0
    bad = [{"start": 1.0, "end": 0.5, "count": 10.0, "rate": 10.0, "warmup": True}] + good
    with pytest.raises(ValueError, match="samples.0: end 0.5 is before start 1.0"):
        stats.steady_state(bad)


# --- baselines ------------------------------------------------------------------------


def test_a_baseline_of_5e_324_items_per_s_is_refused(tmp_path, capsys):
    summary, _ = summarize_dir(RESULTS)
    summary["tests"]["standard.convnet"]["train"].update(
        min=5e-324, max=5e-324, mean=5e-324, std=0.0
    )
    b = tmp_path / "b.json"
    b.write_text(json.dumps(summary))
    code, out, err = cli(["report", RESULTS, "--compare", b], capsys)
    assert (code, out) == (2, "")
    assert err == (
        f"milarun: error: {b}: tests.standard.convnet.train.min: must be 0 or a "
        "rate from 1e-09 to 1e+12 items/s, not 5e-324\n"
    )


def test_a_ratio_that_overflows_in_memory_is_n_a_with_a_warning():
    # in-memory summaries skip the schema: the report's own guard still holds
    summary, _ = summarize_dir(RESULTS)
    ours = normalize_summary(summary)
    base = normalize_summary(json.loads(json.dumps(summary)))
    for t in base["tests"].values():
        if t["train"]["mean"]:
            t["train"].update(mean=5e-324, std=0.0)
            t["effective"] = None
    report = build_report(ours, baseline=base)
    assert report.score is not None and report.score_ratio is None
    assert any(w.startswith("score / baseline is out of range") for w in report.warnings)
    text = render_text(report)
    assert "score / baseline: n/a (out of range" in text
    assert no_inf_or_nan(text)


# --- --price --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "price,shown", [("inf", "inf"), ("nan", "nan"), ("0", "0.0"), ("-1", "-1.0"), ("1e400", "inf")]
)
def test_price_must_be_finite_and_positive(tmp_path, capsys, price, shown):
    # checked before anything is read: a missing results folder is not reached
    code, out, err = cli(["report", tmp_path / "absent", "--price", price], capsys)
    assert (code, out) == (2, "")
    assert (
        err == f"milarun: error: --price must be a finite positive number of dollars, not {shown}\n"
    )


def test_a_finite_price_still_gives_rpp():
    code, text, _ = report_of(RESULTS, price=30000.0)
    assert code == 0 and "price: $30,000.00" in text
    rpp = float(text.split("RPP (price / score): ")[1].split()[0])
    assert math.isfinite(rpp) and rpp > 0


# --- the terminal ---------------------------------------------------------------------------

HOSTILE = "\x1b[2J\x1b[32mSCORE 9999"


def test_an_escape_sequence_in_an_error_message_is_shown_escaped(tmp_path):
    def hostile(record):
        record["error"]["message"] = HOSTILE
        record["host"]["cpu_model"] = "Xeon\u202e\x9b31m"

    folder = results_copy(tmp_path, name=VAE_FAIL, change=hostile)
    code, text, warn = report_of(folder)
    assert code == 0
    assert "\x1b" not in text and "\x9b" not in text and "\u202e" not in text
    assert "oom-killed: \\x1b[2J\\x1b[32mSCORE 9999" in text
    assert "cpu: Xeon\\u202e\\x9b31m" in text


def test_a_newline_in_a_one_line_field_cannot_forge_a_report_line(tmp_path):
    # found by the hostile review: "h\nscore: 99999.00" printed a score line of its own
    def hostile(record):
        record["host"]["hostname"] = "h\nscore: 99999.00"

    folder = results_copy(tmp_path, change=hostile)
    code, text, warn = report_of(folder)
    assert code == 0
    assert not any(line.startswith("score: 99999") for line in text.splitlines())
    assert "h\\nscore: 99999.00" in text


def test_a_control_character_in_a_skipped_file_name_is_shown_escaped(tmp_path):
    folder = results_copy(tmp_path)
    (folder / "evil\x1b[2J.json").write_text("{")
    _, text, warn = report_of(folder)
    assert "\x1b" not in warn and "evil\\x1b[2J.json" in warn


@pytest.mark.parametrize(
    "char,shown",
    [
        ("\x1b", "\\x1b"),
        ("\r", "\\x0d"),
        ("\t", "\\x09"),
        ("\x00", "\\x00"),
        ("\x7f", "\\x7f"),
        ("\x9b", "\\x9b"),
        ("\u202a", "\\u202a"),
        ("\u202e", "\\u202e"),
        ("\u2066", "\\u2066"),
        ("\u2069", "\\u2069"),
    ],
)
def test_terminal_safe_escapes_every_control(char, shown):
    assert terminal_safe(f"a{char}b\nc") == f"a{shown}b\nc"


def test_terminal_safe_keeps_ordinary_text():
    text = "score: 120.03 — 2 × 8 GPUs, café…\n"
    assert terminal_safe(text) == text


# --- energy ---------------------------------------------------------------------------


def test_energy_readings_out_of_range_give_no_energy_not_inf():
    from milarun.analysis.summary import summarize
    from milarun.formats.record import new_result, validate
    from milarun.formats.summary import check_summary
    from milarun.measure import energy

    rec = new_result("s.t", "0.0", device="0", devices=[0], run=0, plan_type="per-gpu")
    rec["timings"]["train"]["samples"] = [
        {"start": 1.0 + i, "end": 2.0 + i, "count": 100.0, "rate": 100.0, "warmup": i < 2}
        for i in range(20)
    ]
    rec["timings"]["program"] = {"start": 1.7e9, "end": 1.7e9 + 25, "duration": 25.0}
    # a counter that grows by 1e17 J/s: within the schema's 1e18 J, not a GPU's power
    rec["gpu_monitor"] = {
        "available": True,
        "interval": 0.5,
        "samples": [{"t": 0.5 * k, "device": 0, "energy": 1e16 * 0.5 * k} for k in range(45)],
    }
    rec["success"] = True
    rec = validate(rec)
    assert energy.result_energy(rec) == {"reason": "GPU readings out of range"}
    summary = summarize([rec])
    assert "energy" not in summary["tests"]["s.t"]
    check_summary(summary)
