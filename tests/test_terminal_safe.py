"""Every string a folder supplies reaches the terminal escaped (milarun/formats/terminal.py).

A bidder or a vendor names the files of the folder it hands over, and the folder itself:
a newline in a name must not start a line of its choosing in ``milarun verify``'s,
``tender``'s or ``report``'s output, an escape sequence in it must not reach the
terminal raw. One real bundle is made once (one launch on a CPU slot, sealed unsigned).
"""

import re
import shutil

import pytest
from conftest import crawl_run

from milarun.cli import main
from milarun.formats.terminal import one_line, terminal_safe
from milarun.verify.seal import seal

#: a name that would print a fake clause on a line of its own, in red
EVIL = "x\nPASS  integrity.forged: all good\x1b[31m"
#: what the terminal acts on or what starts a line: none may come through raw
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    base = tmp_path_factory.mktemp("terminal")
    out = crawl_run(base, "bundle")
    seal(out, say=lambda line: None, warn=lambda line: None)
    (base / "rules.json").write_text("{}")
    return out


@pytest.fixture
def bundle(pristine, tmp_path):
    out = tmp_path / "b"
    shutil.copytree(pristine, out, symlinks=True)
    return out


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code, capsys.readouterr()


def assert_safe(text):
    """No raw control character but the newline, and no line of the name's own."""
    assert not RAW.search(text), text
    assert not any(line.startswith("PASS  integrity.forged") for line in text.splitlines())


def test_one_line_escapes_every_control_character():
    assert one_line(EVIL) == "x\\nPASS  integrity.forged: all good\\x1b[31m"
    assert one_line("a\r\nb\u202ec") == "a\\r\\nb\\u202ec"
    assert one_line(3) == "3"
    assert terminal_safe("a\nb\x1b") == "a\nb\\x1b"  # a whole text keeps its lines


def test_verify_text_shows_a_file_name_with_a_newline_on_one_line(bundle, capsys):
    (bundle / f"{EVIL}.json").write_text("{}")
    code, out = run_cli(["verify", str(bundle)], capsys)
    assert code == 1
    assert "integrity.unchained-file" in out.out
    assert "x\\nPASS  integrity.forged: all good\\x1b[31m" in out.out
    assert_safe(out.out)
    assert_safe(out.err)


def test_verify_error_line_of_a_folder_name_with_an_escape_is_escaped(tmp_path, capsys):
    missing = tmp_path / "gone\x1b[31m\nmilarun: VERIFIED"
    code, out = run_cli(["verify", str(missing)], capsys)
    assert code == 2
    assert_safe(out.err)
    assert len(out.err.splitlines()) == 1


def test_tender_error_line_of_a_bundle_folder_name_with_an_escape(pristine, tmp_path, capsys):
    evil = tmp_path / "acme\x1b[31m"
    shutil.copytree(pristine, evil, symlinks=True)
    code, out = run_cli(
        ["tender", str(evil), "--rules", str(pristine.parent / "rules.json")], capsys
    )
    assert code == 2
    assert "acme\\x1b[31m" in out.err
    assert_safe(out.err)
    assert len(out.err.splitlines()) == 1


def test_tender_text_and_warnings_escape_a_file_name(bundle, capsys):
    (bundle / f"{EVIL}.json").write_text("{}")
    code, out = run_cli(["tender", f"acme={bundle}", "--rules", str(_rules(bundle))], capsys)
    assert code == 1  # the file outside the chain fails verification
    assert_safe(out.out)
    assert_safe(out.err)
    assert "x\\nPASS" in out.out + out.err


def _rules(bundle):
    path = bundle.parent / "rules.json"
    path.write_text("{}")
    return path


def test_report_skipped_file_warning_is_one_line(bundle, capsys):
    (bundle / f"{EVIL}.json").write_text("{not json")
    code, out = run_cli(["report", str(bundle), "--no-cache"], capsys)
    assert code == 0
    skipped = [line for line in out.err.splitlines() if "skipped" in line and "x\\n" in line]
    assert len(skipped) == 1, out.err
    assert_safe(out.err)
    assert_safe(out.out)
