"""config/files.py: a named file is read only if it is a regular file within the size cap, and never blocks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwatchd.config.files import InputFileError, missing, read_text_file, shown_path


def test_reads_a_regular_utf8_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yml"
    f.write_text("host: café\n", encoding="utf-8")
    assert read_text_file(f) == "host: café\n"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (os.mkfifo, "cannot read: not a regular file (a FIFO)"),
        (lambda p: p.symlink_to("/dev/zero"), "cannot read: not a regular file (a device)"),
        (lambda p: p.mkdir(), "cannot read: is a directory, not a file"),
        (lambda p: p.write_bytes(b"x" * 2049), "file too large (2049 bytes; at most 2 KiB)"),
        (lambda p: p.write_bytes(b"ok\n\xc3\x28"), "not UTF-8 text (byte 0xc3 at offset 3)"),
        (lambda p: None, "file not found"),
    ],
    ids=["fifo", "device", "directory", "too-large", "not-utf8", "absent"],
)
def test_refuses_with_one_reason(tmp_path: Path, make: object, message: str) -> None:
    path = tmp_path / "f.yml"
    make(path)  # type: ignore[operator]
    with pytest.raises(InputFileError) as e:
        read_text_file(path, max_bytes=2048)
    assert str(e.value) == message


def test_a_fifo_with_a_writer_is_still_refused_and_never_waited_on(tmp_path: Path) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # a writer that never writes
    try:
        with pytest.raises(InputFileError, match="FIFO"):
            read_text_file(path)
    finally:
        os.close(fd)


def test_paths_the_os_cannot_take() -> None:
    with pytest.raises(InputFileError, match="NUL byte"):
        read_text_file("/tmp/a\0b")
    with pytest.raises(InputFileError, match="file name too long"):
        read_text_file("/tmp/" + "x" * 300)
    assert not missing("/tmp/" + "x" * 300)  # it is not "not found": reading it says why
    assert missing("/nonexistent/file.yml")
    shown = shown_path("/" + "d" * 5000)
    assert len(shown) < 200 and "..." in shown
