"""Text from a report made safe to show: names and messages come from files a user or a downloaded
report supplies, so every writer passes what it shows through here. :func:`without_control_chars`:
no byte that steers a terminal or hides in a page (newlines and tabs stay);
:func:`markdown_without_html`: Markdown in which no ``<`` opens raw HTML.
"""

from __future__ import annotations

import re

# An ANSI escape sequence goes whole: CSI (ESC [ ... final byte), OSC (ESC ] ... BEL or
# ESC-backslash, on one line), any other ESC + one byte.
_ANSI_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)|\x1b[@-_]")
# a log's \r\n, or a progress bar's lone \r: a line break as shown
_LINE_BREAK = re.compile(r"\r\n?")
# C0 but tab and newline, DEL, C1
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# what CommonMark reads as the start of raw HTML or an autolink: "<" then a letter, "/", "!" or "?";
# "< 0.75" and "<= 0.43" are text and stay as typed, so summary.md reads the same raw
_HTML_OPENING = re.compile(r"<(?=[A-Za-z/!?])")


def without_control_chars(text: str) -> str:
    """``text`` with its control characters removed (C0 but newline and tab, DEL, C1; an ANSI escape
    sequence whole); a carriage return becomes a newline."""
    return _CONTROL.sub("", _LINE_BREAK.sub("\n", _ANSI_SEQUENCE.sub("", text)))


def markdown_without_html(text: str) -> str:
    """Markdown ``text`` without control characters, each ``<`` that would open raw HTML written
    ``&lt;`` (which a viewer shows as "<")."""
    return _HTML_OPENING.sub("&lt;", without_control_chars(text))
