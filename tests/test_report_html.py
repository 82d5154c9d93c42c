"""HTML report: self-contained, escaped, with plots; rendered in headless Chromium."""

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from milarun.cli import main

FIX = Path(__file__).parent / "fixtures"
RESULTS = FIX / "results"
XSS = "<script>alert(1)</script>"  # in standard.wlm's stderr tail
CHROMIUM = "/usr/bin/chromium"


class Scan(HTMLParser):
    """Collects script elements, external references, table rows and ids' text."""

    def __init__(self):
        super().__init__()
        self.scripts = 0
        self.external = []
        self.rows = []  # first cell text of each row of table#results (the test)
        self.links = {}  # test -> the href of its name in table#results
        self.flag_links = {}  # test -> the href of its red anomaly tag
        self.ids = {}
        self.legend = []  # (figure id, style of each legend key of a device line)
        self.figures = {}  # figure id -> its class
        self._stack = []
        self._in_results = False
        self._cell = None
        self._in_flag = False
        self._figure = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self.scripts += 1
        for key in ("src", "href"):
            if attrs.get(key) and not attrs[key].startswith("#"):
                self.external.append(attrs[key])
        if tag == "table" and attrs.get("id") == "results":
            self._in_results = True
        if self._in_results and tag == "tr":
            self._cell = None
        if self._in_results and tag == "td" and attrs.get("class") == "test":
            self._cell = ""
        if self._cell is not None and tag == "a":
            if attrs.get("class") == "flag":
                self._in_flag = True
                self.flag_links[self._cell] = attrs.get("href")
            else:
                self._link = attrs.get("href")
        if tag == "figure" and attrs.get("id"):
            self._figure = attrs["id"]
            self.figures[attrs["id"]] = attrs.get("class", "")
        if tag == "i" and attrs.get("class") == "line":
            self.legend.append((self._figure, attrs.get("style", "")))
        self._stack.append((tag, attrs.get("id")))

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_results = False
        if tag == "a":
            self._in_flag = False
        if self._in_results and tag == "td" and self._cell is not None:
            self.rows.append(self._cell)
            self.links[self._cell] = getattr(self, "_link", None)
            self._link = None
            self._cell = None
        while self._stack:
            t, _ = self._stack.pop()
            if t == tag:
                break

    def handle_data(self, data):
        if self._cell is not None and not self._in_flag:
            self._cell += data.strip()
        for _, ident in self._stack:
            if ident:
                self.ids[ident] = self.ids.get(ident, "") + data


def cli(args):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    return exc.value.code


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "r.html"
    code = cli(
        [
            "report",
            RESULTS,
            "--weights",
            FIX / "weights.json",
            "--compare",
            FIX / "baseline2020.json",
            "--price",
            "30000",
            "--compare-gpus",
            "--html",
            out,
        ]
    )
    assert code == 0
    return out


def check_dom(text):
    scan = Scan()
    scan.feed(text)
    assert scan.scripts == 0, "no script element may come from the data"
    assert scan.external == []
    assert scan.ids["score-value"].strip() == "167.83"
    assert scan.ids["verdict"].strip() == "FAIL"
    assert scan.ids["score-ratio"].strip() == "0.883"
    assert scan.ids["rpp"].strip() == "178.75"
    assert "standard.ssd" in scan.ids["missing"]
    assert scan.rows == [
        "standard.convnet",
        "standard.scaling.1",
        "standard.scaling.2",
        "standard.short",
        "standard.vae",
        "standard.wlm",
    ]
    return scan


def test_html_is_self_contained_and_escaped(page):
    text = page.read_text()
    assert "<script" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    # one throughput plot per test with successful results (5) + the heat-map
    assert text.count("<svg") == 6
    assert "oom-killed" in text and "logs/standard.vae.J0.1.log" in text
    assert "step 49: loss" in text  # tail of the log file
    assert "loading wikitext-2" in text  # stderr_tail of the timeout (no log file)
    check_dom(text)


def test_html_from_summary_has_no_plots(tmp_path):
    s = tmp_path / "s.json"
    assert cli(["summary", RESULTS, "-o", s]) == 0
    out = tmp_path / "r.html"
    assert cli(["report", s, "--html", out]) == 0
    text = out.read_text()
    assert "<svg" not in text and "Plots need the results directory" in text
    assert "Killed" in text  # stderr_tail carried by the summary


def test_html_from_results_without_a_plot_does_not_say_summary(tmp_path):
    # a results folder where no test has a run to draw (every run failed): the page does not
    # claim it was made from a summary
    results = tmp_path / "results"
    results.mkdir()
    for path in Path(RESULTS).glob("*.FAIL.*.json"):
        shutil.copy(path, results)
    out = tmp_path / "r.html"
    assert cli(["report", results, "--unweighted", "--no-cache", "--html", out]) == 0
    text = out.read_text()
    assert "<svg" not in text and "Plots need the results directory" not in text


@pytest.mark.browser
def test_rendered_dom_in_headless_chromium(page, tmp_path):
    exe = shutil.which("chromium") or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if exe is None:
        reason = "chromium is not installed (run scripts/install-browser.sh)"
        if os.environ.get("MILARUN_REQUIRE_BROWSER") == "1":
            pytest.fail(f"MILARUN_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    proc = subprocess.run(
        [
            exe,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            f"--user-data-dir={tmp_path}",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    scan = check_dom(dom)
    assert len(re.findall(r"<svg\b", dom)) == 6
    # The hostile text is text in the DOM, never an element.
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert scan.scripts == 0


def figures_of(text):
    """``{figure id: its HTML}`` of the throughput plots."""
    parts = re.findall(r'<figure class="plot[^"]*" id="([^"]+)">(.*?)</figure>', text, re.S)
    return dict(parts)


def test_legend_keys_are_css_colours_of_their_lines(page):
    text = page.read_text()
    scan = check_dom(text)
    figures = figures_of(text)
    assert set(figures) == {
        f"plot-{t}"
        for t in [
            "standard.convnet",
            "standard.scaling.1",
            "standard.scaling.2",
            "standard.short",
            "standard.vae",
        ]
    }
    assert len(scan.legend) == 6  # convnet has devices 0 and 1
    for figure, style in scan.legend:
        m = re.fullmatch(r"background: (#[0-9a-f]{6})", style)
        assert m, style  # a CSS colour, not a Python tuple
        assert f"stroke: {m.group(1)}" in figures[figure]  # the colour of a line drawn
    # the steady-state band and the warm-up dots have their own legend entries
    assert all("steady-state samples" in f and "warm-up" in f for f in figures.values())


def test_rows_link_to_their_plot_and_flags_are_shown(page):
    from milarun.report.plots import FLAG_COLOUR

    text = page.read_text()
    scan = check_dom(text)
    assert scan.links["standard.convnet"] == "#plot-standard.convnet"
    assert scan.links["standard.wlm"] is None  # every run failed: no plot
    assert all(scan.links[t][1:] in scan.figures for t in scan.rows if scan.links[t])
    # the planted stall of convnet: a red tag beside the test, the list, marks on its plot
    assert scan.flag_links == {
        "standard.convnet": "#flags-standard.convnet",
        "standard.short": "#flags-standard.short",
    }
    assert "stall" in scan.ids["flags-standard.convnet"]
    assert "slow-windows" in scan.ids["flags-standard.convnet"]
    assert "short-steady" in scan.ids["flags-standard.short"]
    assert "flagged" in scan.figures["plot-standard.convnet"]
    convnet = figures_of(text)["plot-standard.convnet"]
    assert FLAG_COLOUR in convnet and "slow window" in convnet and ">stall<" in convnet
    assert FLAG_COLOUR not in figures_of(text)["plot-standard.vae"]
    # the header names the inputs; one result is "unknown (n=1)", never 0.00%
    assert scan.ids["input-weights"] == "weightstests/fixtures/weights.json"  # th + td
    assert "baseline2020.json" in scan.ids["input-baseline"]
    assert (
        "unknown (n=1)" in text
        and "0.00%" not in text.split('id="results"')[1].split("</table>")[0]
    )


def chromium():
    exe = shutil.which("chromium") or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if exe is None:
        reason = "chromium is not installed (run scripts/install-browser.sh)"
        if os.environ.get("MILARUN_REQUIRE_BROWSER") == "1":
            pytest.fail(f"MILARUN_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    return exe


#: Injected into a COPY of the page (the report itself has no script): the computed
#: colour of each legend key, the layout of the plots, written into the DOM.
PROBE = """<script>
window.addEventListener("load", () => {
  const keys = [...document.querySelectorAll(".legend i.line")].map(
    i => [i.style.background, getComputedStyle(i).backgroundColor]);
  const figs = [...document.querySelectorAll(".plots figure")].map(
    f => Math.round(f.getBoundingClientRect().top));
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify({keys: keys, tops: figs,
    display: getComputedStyle(document.querySelector(".plots")).display});
  document.body.appendChild(pre);
});
</script></body>"""


@pytest.mark.browser
def test_legend_colours_and_grid_in_headless_chromium(page, tmp_path):
    import html
    import json

    exe = chromium()
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", PROBE))
    proc = subprocess.run(
        [
            exe,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            f"--user-data-dir={tmp_path}",
            "--window-size=1400,2400",
            "--dump-dom",
            probe.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(
        html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S).group(1))
    )
    assert len(found["keys"]) == 6
    for _, computed in found["keys"]:
        # a valid colour computes to an opaque rgb(); an invalid one to transparent
        assert re.fullmatch(r"rgb\(\d+, \d+, \d+\)", computed), computed
    assert len({c for _, c in found["keys"]}) == 2  # device 0 and device 1
    assert found["display"] == "grid"
    tops = found["tops"]
    assert len(tops) == 5 and len(set(tops)) < len(tops)  # side by side at 1400 px
    # and a screenshot renders
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [
            exe,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            f"--user-data-dir={tmp_path}",
            "--window-size=1400,2400",
            f"--screenshot={shot}",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
