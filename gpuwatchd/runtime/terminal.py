"""Text from a daemon made safe to print to a terminal (``status``, ``status --watch``, ``silence list``).

Process names, user names, Xid text, dock names and silence comments come from whoever started a process, wrote a
kernel line or created a silence. Printed as they are, ``ESC [2J`` clears the screen, ``ESC ]0;...`` retitles the
window, ``ESC ]8;;url`` makes a link, a CR rewrites the line and a bidi override reorders it. Every character that
is not printable (C0 and C1 controls, DEL, format and bidi characters, unassigned code points) is shown as ``?``,
and a string is cut to :data:`MAX_CHARS` (a 1 MB process name would widen every row of a table to 1 MB).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

# Long enough for the longest advice and summary the daemon writes (rules/advice.py: ~250 characters; a cut advice
# loses its command), short enough that a hostile string cannot widen a table row without bound.
MAX_CHARS = 500
# One line a command writes (a table row, an error with the daemon's words in it): long enough for any real one.
MAX_LINE_CHARS = 4000
ELLIPSIS = "…"


def terminal_safe(text: str, max_chars: int = MAX_CHARS) -> str:
    """``text`` with every non-printable character as ``?``, at most ``max_chars`` characters."""
    if len(text) > max_chars:
        text = text[: max_chars - 1] + ELLIPSIS
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else "?" for c in text)


def safe_tree(value: Any, max_chars: int = MAX_CHARS) -> Any:
    """A JSON document with every string (keys too) through :func:`terminal_safe`."""
    if isinstance(value, str):
        return terminal_safe(value, max_chars)
    if isinstance(value, dict):
        return {terminal_safe(k, max_chars) if isinstance(k, str) else k: safe_tree(v, max_chars)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe_tree(v, max_chars) for v in value]
    return value


def safe_lines(text: str, max_chars: int = MAX_LINE_CHARS) -> str:
    """``text`` with every line through :func:`terminal_safe` (the line breaks kept, a CR is a ``?``)."""
    return "\n".join(terminal_safe(line, max_chars) for line in text.split("\n"))


def say(text: str, file: TextIO | None = None, max_chars: int = MAX_LINE_CHARS) -> None:
    """Print ``text`` (which may hold a daemon's words: ids, errors, comments, receiver answers) terminal-safe:
    the one writer of the client commands' lines."""
    print(safe_lines(text, max_chars), file=file if file is not None else sys.stdout)
