"""Reading the small state files the daemon keeps in ``state_dir`` (kernel-log position, probe baselines, rule
history): bounded, and a file that cannot be used is moved aside like the database (``notify/store/database.py``),
never a reason not to start.

:func:`read_json` reads at most ``max_bytes`` and raises :class:`StateFileError` for every way a file can be bad
(unreadable, too large, not UTF-8, not JSON, nested too deep); :func:`set_aside` renames it to
``<name>.corrupt-<UTC time>`` so the next save starts a fresh file and the bad one is kept for a post-mortem.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from gpuwatchd.notify.json_body import BodyError, check_depth

# The largest state file a daemon writes is the rule history (store/persist.py bounds it separately); the JSON ones
# hold a few hundred entries at most.
MAX_JSON_BYTES = 4 * 1024 * 1024


class StateFileError(ValueError):
    """A state file that exists but cannot be used; the message says why in a few words."""


def read_bytes(path: Path, max_bytes: int) -> bytes | None:
    """The file's bytes (None when it does not exist); StateFileError when unreadable or over ``max_bytes``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StateFileError(f"cannot read it ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # a FIFO or device would block or never end
                raise StateFileError("not a regular file")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise StateFileError(f"cannot read it ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise StateFileError(f"larger than {max_bytes} bytes")
    return data


def read_json(path: Path, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The file's JSON (None when it does not exist); StateFileError for anything unusable."""
    data = read_bytes(path, max_bytes)
    if data is None:
        return None
    try:
        check_depth(data)
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise StateFileError("not UTF-8") from None
    except BodyError:
        raise StateFileError("JSON nested too deep") from None
    except (ValueError, RecursionError) as e:
        raise StateFileError(f"not JSON ({str(e)[:80]})") from None


def set_aside(path: Path) -> Path | None:
    """Rename ``path`` to ``<name>.corrupt-<UTC time>[.n]``; the new path, or None when it cannot be renamed."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists() and n < 100:
        aside = path.with_name(f"{path.name}.corrupt-{stamp}.{n}")
        n += 1
    try:
        os.replace(path, aside)
    except OSError:
        return None
    return aside
