"""argparse types for the options every client command shares, checked when the command line is parsed: a bad
value is one ``gpuwatchd doctor: error: argument --deadline: ...`` line and exit 2, never a traceback later."""

from __future__ import annotations

import argparse
import math
from urllib.parse import urlsplit

# A hung NVML or torch probe is killed after --deadline seconds; an hour is far past any real start-up and keeps
# the timeout arithmetic (milliseconds, event-loop deadlines) in range. NaN, inf, 0 and negatives are refused.
MAX_DEADLINE_SECONDS = 3600.0
# --timeout of the commands that ask a daemon (status, silence, notify test): an answer takes milliseconds; an hour
# is far past any, and NaN, inf (an OverflowError in asyncio's timer), 0 and negatives would mean "wait forever" or
# nothing at all.
MAX_TIMEOUT_SECONDS = 3600.0
# Longest number text looked at: "1e400" and 4000-digit integers are not a number of seconds anyone means.
MAX_NUMBER_CHARS = 32
# Longest URL accepted on the command line (a real one is a few dozen characters).
MAX_URL_CHARS = 2048


def seconds_up_to(text: str, maximum: float) -> float:
    """A positive, finite number of seconds, at most ``maximum`` (argparse's one-line error otherwise)."""
    try:
        value = float(text) if len(text) <= MAX_NUMBER_CHARS else math.nan
    except ValueError:
        raise argparse.ArgumentTypeError(f"{_shown(text)!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= maximum:
        raise argparse.ArgumentTypeError(
            f"{_shown(text)}: must be a number of seconds above 0 and at most {maximum:g}")
    return value


def deadline_seconds(text: str) -> float:
    """A positive, finite number of seconds, at most :data:`MAX_DEADLINE_SECONDS`."""
    return seconds_up_to(text, MAX_DEADLINE_SECONDS)


def timeout_seconds(text: str) -> float:
    """``--timeout`` of a daemon client: positive, finite, at most :data:`MAX_TIMEOUT_SECONDS`."""
    return seconds_up_to(text, MAX_TIMEOUT_SECONDS)


def daemon_url(text: str) -> str:
    """A daemon's base URL: ``http://`` or ``https://``, a host, an optional valid port; returned without the
    trailing ``/``."""
    if len(text) > MAX_URL_CHARS:
        raise argparse.ArgumentTypeError(f"longer than {MAX_URL_CHARS} characters")
    if any(ord(c) < 0x21 or c == "\x7f" for c in text):
        raise argparse.ArgumentTypeError(f"{_shown(text)!r}: white space or control characters in the URL")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{_shown(text)!r} is not a URL ({e})") from None
    if parts.scheme not in ("http", "https"):
        raise argparse.ArgumentTypeError(
            f"{_shown(text)!r}: expected an http:// or https:// URL such as http://127.0.0.1:9945")
    if not parts.hostname:
        raise argparse.ArgumentTypeError(f"{_shown(text)!r}: no host in the URL")
    if port == 0:
        raise argparse.ArgumentTypeError(f"{_shown(text)!r}: port 0 cannot be connected to")
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"{_shown(text)!r}: a base URL has no ?query or #fragment")
    return text.rstrip("/")


def _shown(text: str) -> str:
    return text if len(text) <= 80 else f"{text[:60]}...{text[-12:]}"
