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
XSS = "<script>alert(1)</script>"    # in standard.wlm's stderr tail
CHROMIUM = "/usr/bin/chromium"


class Scan(HTMLParser):
    """Collects script elements, external references, table rows and ids' text."""

    def __init__(self):
        super().__init__()
        self.scripts = 0
        self.external = []
        self.rows = []       # first cell text of each row of table#results
        self.ids = {}
        self._stack = []
        self._in_results = False
        self._cell = None

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
        self._stack.append((tag, attrs.get("id")))

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_results = False
        if self._in_results and tag == "td" and self._cell is not None:
            self.rows.append(self._cell)
            self._cell = None
        while self._stack:
            t, _ = self._stack.pop()
            if t == tag:
                break

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
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
    code = cli(["report", RESULTS, "--weights", FIX / "weights.json",
                "--compare", FIX / "baseline2020.json", "--price", "30000",
                "--compare-gpus", "--html", out])
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
    assert scan.rows == ["standard.convnet", "standard.scaling.1", "standard.scaling.2",
                         "standard.short", "standard.vae", "standard.wlm"]
    return scan


def test_html_is_self_contained_and_escaped(page):
    text = page.read_text()
    assert "<script" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    # one throughput plot per test with successful results (5) + the heat-map
    assert text.count("<svg") == 6
    assert "oom-killed" in text and "logs/standard.vae.J0.1.log" in text
    assert "step 49: loss" in text          # tail of the log file
    assert "loading wikitext-2" in text     # stderr_tail of the timeout (no log file)
    check_dom(text)


def test_html_from_summary_has_no_plots(tmp_path):
    s = tmp_path / "s.json"
    assert cli(["summary", RESULTS, "-o", s]) == 0
    out = tmp_path / "r.html"
    assert cli(["report", s, "--html", out]) == 0
    text = out.read_text()
    assert "<svg" not in text and "Plots need the results directory" in text
    assert "Killed" in text                 # stderr_tail carried by the summary


@pytest.mark.browser
def test_rendered_dom_in_headless_chromium(page, tmp_path):
    exe = shutil.which("chromium") or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if exe is None:
        reason = "chromium is not installed (run scripts/install-browser.sh)"
        if os.environ.get("MILARUN_REQUIRE_BROWSER") == "1":
            pytest.fail(f"MILARUN_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    proc = subprocess.run(
        [exe, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path}",
         "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    scan = check_dom(dom)
    assert len(re.findall(r"<svg\b", dom)) == 6
    # The hostile text is text in the DOM, never an element.
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert scan.scripts == 0
