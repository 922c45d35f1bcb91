"""Reading input files the user names (config, scenario, XML capture) without hanging or blowing up memory.

A FIFO, ``/dev/zero`` or ``/dev/urandom`` given as a config file would block or never end a plain ``read_text``;
a huge file would be read whole. So: the path is checked first (NUL byte, length), the file is ``stat``-ed before
it is opened and must be a regular file, it is opened with ``O_NONBLOCK`` (opening a FIFO without a writer would
otherwise block) and read with a size cap. Every failure is one :class:`InputFileError` with a file-level message.
"""

from __future__ import annotations

import errno
import os
import stat

# A real config is a few KiB and a scenario a few (the largest built-in one: 5 KiB); 256 KiB is far past both and
# still parses (pure-Python YAML, bounded) in about a second on a busy 2-core host, also on SIGHUP.
MAX_CONFIG_BYTES = 256 << 10
# `nvidia-smi -q -x` writes ~15-25 KiB per GPU plus ~0.3 KiB per process: 8 MiB holds 16 GPUs with thousands of
# processes each.
MAX_XML_BYTES = 8 << 20


class InputFileError(Exception):
    """A file that cannot be read as text; ``str`` is the reason, without the file name."""


def read_text_file(path: str | os.PathLike[str], *, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of the regular file at ``path``, at most ``max_bytes`` long, never blocking on it."""
    data = read_bytes_file(path, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def read_bytes_file(path: str | os.PathLike[str], *, max_bytes: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, with the same checks as :func:`read_text_file`, for files that
    are decoded line by line (a pasted kernel log: one non-UTF-8 line must not reject the rest)."""
    name = os.fspath(path)
    if "\0" in str(name):
        raise InputFileError("the path contains a NUL byte")
    try:
        st = os.stat(name)
    except FileNotFoundError:
        raise InputFileError("file not found") from None
    except (OSError, ValueError) as e:
        raise InputFileError(f"cannot read: {_reason(e)}") from None
    _check_stat(st, max_bytes)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise InputFileError(f"cannot read: {_reason(e)}") from None
    try:
        _check_stat(os.fstat(fd), max_bytes)  # the path may have been replaced between stat and open
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise InputFileError(f"cannot read: {_reason(e)}") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise InputFileError(f"file too large (more than {_size(max_bytes)})")
    return b"".join(chunks)


def _check_stat(st: os.stat_result, max_bytes: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError("cannot read: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(
            st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file"
        raise InputFileError(f"cannot read: not a regular file ({kind})")
    if st.st_size > max_bytes:
        raise InputFileError(f"file too large ({_size(st.st_size)}; at most {_size(max_bytes)})")


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno == errno.ENAMETOOLONG:
        return "file name too long"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)


def _size(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n // 1024} KiB" if n >= 1 << 10 and n % 1024 == 0 else f"{n} bytes"


def shown_path(path: str | os.PathLike[str]) -> str:
    """``path`` for a message: an over-long one is cut in the middle, so the error stays one readable line."""
    text = os.fspath(path)
    text = text if isinstance(text, str) else os.fsdecode(text)
    return text if len(text) <= 200 else f"{text[:120]}...{text[-60:]}"


def missing(path: str | os.PathLike[str]) -> bool:
    """True when nothing is at ``path``; False for anything else, even a path the OS cannot take (NUL, too long):
    reading it then says why."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except (OSError, ValueError):
        return False
    return False
