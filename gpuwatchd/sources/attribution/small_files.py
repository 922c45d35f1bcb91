"""The files attribution reads (``/proc/PID/cgroup``, the runtimes' ``config.json``, job-mapping files) read
bounded and never blocking, and the text they give checked before it becomes a label value.

``proc_root``, ``host_root`` and the job-mapping directory may point at trees others write (a fake ``/proc`` in a
container, a site's prolog scripts): a FIFO there would block a plain ``open``/``read`` on the event loop for
good, ``/dev/zero`` would never end, a huge file would be read whole. Here a file is opened ``O_NONBLOCK``, must
be a regular file (procfs files are), and is read to at most ``max_bytes``; anything else is an ``OSError`` whose
``strerror`` says why in a few words.

Label values from these files (job ids, container and pod names, images) are exported on every per-process series
and put in alert labels, messages and the status page: :func:`label_value` keeps a value only when it is short and
holds no control, format (bidi) or unassigned characters, so a value is either one a runtime could have written or
"not known".
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

# The longest name Kubernetes allows (a DNS subdomain: pod names); image references are longer.
MAX_NAME_CHARS = 253
MAX_IMAGE_CHARS = 512


def read_small(path: Path | str, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``; OSError when it is gone, unreadable, not a regular file or
    longer than ``max_bytes`` (``strerror`` says which)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
            raise OSError(errno.EINVAL, f"not a regular file ({kind})")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:  # procfs files say size 0 and may answer in several reads
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes")
    return b"".join(chunks)


def label_value(value: object, max_chars: int = MAX_NAME_CHARS) -> str | None:
    """``value`` when it is a non-empty string of at most ``max_chars`` characters without control, format
    (bidi overrides, zero-width), surrogate, private-use or unassigned characters; else None."""
    if not isinstance(value, str) or not 0 < len(value) <= max_chars:
        return None
    # str.isprintable() is False for Cc, Cf (bidi controls), Cs, Co, Cn and every separator but the space
    return value if value.isprintable() else None
