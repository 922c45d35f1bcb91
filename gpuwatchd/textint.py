"""Numbers read from text someone else wrote (the kernel log, request bodies): ASCII digits only, bounded length.

``int()`` accepts Unicode digits (Arabic-Indic, fullwidth), underscores and surrounding whitespace, and raises
``ValueError`` past 4300 digits (CPython's conversion limit); none of that belongs in a kernel-log field or an API
value. :func:`ascii_uint` checks the text first, so conversion never raises and never runs on a huge string.
"""

from __future__ import annotations

import re

# Enough for any 64-bit counter (20 digits); anything longer is not a number a kernel or an API sends.
MAX_DIGITS = 20
_ASCII_DIGITS = re.compile(r"[0-9]+")


def ascii_uint(text: str, max_digits: int = MAX_DIGITS) -> int | None:
    """``text`` as a non-negative integer when it is 1..``max_digits`` ASCII digits and nothing else; else None."""
    if not 0 < len(text) <= max_digits or _ASCII_DIGITS.fullmatch(text) is None:
        return None
    return int(text)
