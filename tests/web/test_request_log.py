"""Malformed requests are the client's fault: a rate-limited DEBUG line each and a counter, never an ERROR with a
traceback; a handler's own bug still is an ERROR with its traceback."""

from __future__ import annotations

import logging

import pytest
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong

from gpuwatchd.web.request_log import BURST, WINDOW_SECONDS, RequestLogger


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_malformed_requests_are_debug_lines_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = RequestLogger(clock=clock)
    with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
        for i in range(5 * BURST):
            exc = BadHttpMessage(f"bad header\r\nline {i}") if i % 2 else LineTooLong("line", "8190")
            log.exception("Error handling request from %s", "127.0.0.1", exc_info=exc)
        clock.t += WINDOW_SECONDS
        log.exception("Error handling request from %s", "127.0.0.1", exc_info=BadHttpMessage("late"))
    assert log.bad_requests == 5 * BURST + 1
    records = caplog.records
    assert all(r.levelno == logging.DEBUG and r.exc_info is None for r in records)
    assert all("\n" not in r.getMessage() and "\r" not in r.getMessage() for r in records)
    lines = [r.getMessage() for r in records]
    assert len([m for m in lines if "malformed request from 127.0.0.1" in m]) == BURST + 1
    assert f"{4 * BURST} more malformed requests" in "\n".join(lines)


def test_other_errors_stay_errors_with_traceback(caplog: pytest.LogCaptureFixture) -> None:
    log = RequestLogger()
    try:
        raise RuntimeError("handler bug")
    except RuntimeError as e:
        with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
            log.exception("Error handling request from %s", "127.0.0.1", exc_info=e)
    (rec,) = caplog.records
    assert rec.levelno == logging.ERROR and rec.exc_info is not None and log.bad_requests == 0
