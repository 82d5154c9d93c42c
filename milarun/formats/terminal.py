"""Strings from files, made safe to print on a terminal.

A record, summary, baseline or profile may come from anyone: an escape sequence
in it must not clear the screen or draw a fake score, and a newline in a field
meant as one line must not add a line of its own.

:func:`one_line` is the one formatter of a string a folder supplies (a file name,
a message, a host fact, a clause's detail) in a line of text output: every control
character shown escaped, newlines included. :func:`terminal_safe` is for a whole
text of several lines, built from fields already passed through :func:`one_line`.
The CLI prints every ``milarun: error:`` line through :func:`one_line`.
"""

from __future__ import annotations

import re

#: What a terminal acts on instead of showing: C0 controls but the newline (ESC, CR,
#: backspace, tab...), DEL, C1 controls (CSI is U+009B), and the bidirectional
#: overrides, embeddings and isolates (U+202A-U+202E, U+2066-U+2069, with the marks
#: U+200E, U+200F and U+061C) that reorder what is shown ("Trojan Source",
#: CVE-2021-42574).
_TERMINAL_CONTROL = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every terminal control character shown as its Python escape
    (ESC as the four characters ``\\x1b``, U+202E as ``\\u202e``); newlines kept."""
    return _TERMINAL_CONTROL.sub(_escape, text)


def one_line(text: object) -> str:
    """``text`` (any object: its ``str``) as one terminal-safe line: its newlines shown
    as ``\\n`` (``\\r`` for CR), every other terminal control character as
    :func:`terminal_safe` shows it. A string from a file meant as one line (a hostname
    ``"h\\nscore: 99999.00"``, a file name ``"x\\x1b[31m.json"``) can neither add a
    line of its own to the output nor act on the terminal."""
    return terminal_safe(str(text).replace("\r", "\\r").replace("\n", "\\n"))
