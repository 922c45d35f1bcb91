"""Exposition encoders for /metrics, byte-identical to prometheus_client's, at a fraction of the CPU.

Why hand-written: profiling the render of 8 GPUs x 32 processes (``python -m cProfile bench/scrape.py --profile``)
puts 90 % of the time in prometheus_client 0.26's encoders, not in building the families: its OpenMetrics encoder
escapes every sample name character by character through a Python callback (``_escape`` + ``_is_legacy_*_rune``,
about 1 M calls per page), 19 of 21 ms; the text encoder spends 9 of 11 ms on similar per-sample work.

These encoders produce the same bytes for the common case: legacy-valid metric and label names, the default
``underscores`` escaping, and samples without exemplars or native histograms. Any family outside that case is
handed to prometheus_client's own encoder, one family at a time, so the output stays exactly what the library
would write (``tests/exporter/test_encode.py`` compares both on the real daemon's families and on odd inputs).
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import exposition
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as om
from prometheus_client.registry import Collector

Encoder = Callable[[Collector], bytes]

# Names the library writes unchanged under the default escaping. ':' is left out on purpose: the library's
# OpenMetrics encoder turns ':' in sample names into '_' (it checks them with the label-name rule), so such
# families take the library path.
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
# The text format moves these OpenMetrics-only samples into gauges of their own after the family.
_TEXT_MOVED_SUFFIXES = ("_created", "_gsum", "_gcount")
_TEXT_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_INF = math.inf


class _One:
    """One family as a registry, for the library encoder."""

    __slots__ = ("metric",)

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


def go_float(d: Any) -> str:
    """``prometheus_client.utils.floatToGoString``, inlined for the common finite case."""
    d = float(d)
    if math.isnan(d):
        return "NaN"
    if d == _INF:
        return "+Inf"
    if d == -_INF:
        return "-Inf"
    s = repr(d)
    dot = s.find(".")
    # Go switches to exponents sooner than Python (the library's comment: only positive values matter here).
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _escape_value(v: str) -> str:
    # Label values: backslash, newline and double quote, in that order, as both library encoders do.
    if "\\" in v or "\n" in v or '"' in v:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return v


# Names already checked against _PLAIN_NAME. They come from code (family, sample and label names), so the set stays
# small; the cap only guards against a collector that makes names up.
_CHECKED: set[str] = set()
_CHECKED_MAX = 4096


def _plain_name(name: str) -> bool:
    if name in _CHECKED:
        return True
    if not _PLAIN_NAME.match(name) or name.startswith("__"):
        return False
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED.add(name)
    return True


class _Lines:
    """The sample lines of one family, possibly written a slice of samples at a time (same text either way)."""

    __slots__ = ("labelstrs", "moved", "text", "values")

    def __init__(self, metric: Metric, text: bool) -> None:
        self.text = text
        self.moved = tuple(metric.name + s for s in _TEXT_MOVED_SUFFIXES) if text else ()
        # Within a family every sample has the same label names in the same order, so the unsorted items identify
        # the label string; per-GPU families repeat label sets (uuid, reason...), so each is formatted once.
        self.labelstrs: dict[tuple[tuple[str, str], ...], str] = {}
        self.values: dict[Any, str] = {}

    def lines(self, samples: Iterable[Any]) -> list[str] | None:
        """The lines of ``samples``; None when one of them needs the library's encoder (then the whole family
        does)."""
        text, moved, labelstrs, values = self.text, self.moved, self.labelstrs, self.values
        lines: list[str] = []
        for s in samples:
            name = s.name
            if s.exemplar is not None or s.native_histogram is not None or not _plain_name(name) or name in moved:
                return None
            labels = s.labels
            if labels:
                key = tuple(labels.items())
                labelstr = labelstrs.get(key)
                if labelstr is None:
                    if not all(_plain_name(k) for k in labels):
                        return None
                    labelstr = labelstrs[key] = (
                        "{" + ",".join([f'{k}="{_escape_value(v)}"' for k, v in sorted(key)]) + "}")
            else:
                labelstr = ""
            v = s.value
            value: str | None
            if v is None and not text:
                value = ""
            else:
                # Memoised per family for floats only; not 0.0, which would stand for -0.0 too ("-0.0" vs "0.0").
                memo = type(v) is float and v != 0.0
                value = values.get(v) if memo else None
                if value is None:
                    value = go_float(v)
                    if memo:
                        values[v] = value
            if s.timestamp is None:
                lines.append(f"{name}{labelstr} {value}\n")
            elif text:
                lines.append(f"{name}{labelstr} {value} {int(float(s.timestamp) * 1000):d}\n")
            else:
                lines.append(f"{name}{labelstr} {value} {s.timestamp}\n")
        return lines


# Set on a family by ``freeze``: its encoded text per format, filled on first use.
_ENCODED = "_gpuwatchd_encoded"


def freeze(metric: Metric) -> Metric:
    """Promise that ``metric`` will not change again, so its encoded text can be kept with it and reused.

    The store collector builds per-GPU families once per snapshot (snapshots are immutable) and hands the same
    family objects to every scrape of that snapshot; frozen, they are also encoded once per format.
    """
    setattr(metric, _ENCODED, {})
    return metric


def _om_head(metric: Metric) -> str | None:
    """The family's HELP, TYPE and UNIT lines in OpenMetrics; None when the library must encode it."""
    name = metric.name
    if not _plain_name(name):
        return None
    doc = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    head = f"# HELP {name} {doc}\n# TYPE {name} {metric.type}\n"
    if metric.unit:
        head += f"# UNIT {name} {metric.unit}\n"
    return head


def _om_library(metric: Metric) -> str:
    library: Callable[[_One], bytes] = om.generate_latest
    return library(_One(metric)).decode("utf-8").removesuffix("# EOF\n")


def _om_family(metric: Metric) -> str:
    head = _om_head(metric)
    if head is not None:
        lines = _Lines(metric, text=False).lines(metric.samples)
        if lines is not None:
            return "".join([head, *lines])
    return _om_library(metric)


def _text_head(metric: Metric) -> str | None:
    """The family's HELP and TYPE lines in the text format; None when the library must encode it."""
    if not _plain_name(metric.name):
        return None
    mtype = metric.type
    name = metric.name
    if mtype == "counter":
        name += "_total"
    elif mtype == "info":
        name += "_info"
    mtype = _TEXT_TYPES.get(mtype, mtype)
    doc = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n"


def _text_library(metric: Metric) -> str:
    return exposition.generate_latest(_One(metric)).decode("utf-8")


def _text_family(metric: Metric) -> str:
    head = _text_head(metric)
    if head is not None:
        lines = _Lines(metric, text=True).lines(metric.samples)
        if lines is not None:
            return "".join([head, *lines])
    return _text_library(metric)


def _family_text(metric: Metric, family: Callable[[Metric], str], fmt: str) -> str:
    encoded: dict[str, str] | None = getattr(metric, _ENCODED, None)
    if encoded is None:
        return family(metric)
    text = encoded.get(fmt)
    if text is None:
        text = encoded[fmt] = family(metric)
    return text


def openmetrics_latest(registry: Collector) -> bytes:
    """OpenMetrics 1.0.0 with the default escaping; same bytes as ``openmetrics.exposition.generate_latest``."""
    out = [_family_text(m, _om_family, "openmetrics") for m in registry.collect()]
    out.append("# EOF\n")
    return "".join(out).encode("utf-8")


def text_latest(registry: Collector) -> bytes:
    """Prometheus text 0.0.4 with the default escaping; same bytes as ``exposition.generate_latest``."""
    return "".join([_family_text(m, _text_family, "text") for m in registry.collect()]).encode("utf-8")


# How long encoding runs before letting the event loop serve others: a scrape arriving during a render waits
# about this long at most (it is answered from the previous body, see http.MetricsRenderer).
SLICE_SECONDS = 0.001
# Samples of one family encoded between two looks at the clock: a per-process family at 16 GPUs x 256 processes
# holds 4,096 samples (tens of ms), so a family is itself cut into slices (~0.3 ms each).
SLICE_SAMPLES = 256


class _Slices:
    """The clock of a yielding encode: ``tick`` lets the event loop run once ``SLICE_SECONDS`` of work are done."""

    __slots__ = ("deadline",)

    def __init__(self) -> None:
        self.deadline = time.perf_counter() + SLICE_SECONDS

    async def tick(self) -> None:
        if time.perf_counter() >= self.deadline:
            await asyncio.sleep(0)
            self.deadline = time.perf_counter() + SLICE_SECONDS


async def _family_sliced(metric: Metric, text: bool, slices: _Slices) -> str:
    """``_om_family`` / ``_text_family`` of ``metric``, same text, a slice of samples at a time."""
    head = _text_head(metric) if text else _om_head(metric)
    samples = metric.samples
    if head is not None:
        writer = _Lines(metric, text)
        parts = [head]
        for i in range(0, len(samples), SLICE_SAMPLES):
            lines = writer.lines(samples[i:i + SLICE_SAMPLES])
            if lines is None:
                break
            parts += lines
            await slices.tick()
        else:
            return "".join(parts)
    return _text_library(metric) if text else _om_library(metric)


async def encode_yielding(metrics: Iterable[Metric], encoder: Encoder) -> bytes:
    """What ``encoder`` (``openmetrics_latest`` or ``text_latest``) writes for ``metrics``, same bytes, yielding to
    the event loop every ``SLICE_SECONDS`` of work (within a family too) so that a render never holds the loop for
    long. The families must not change while this runs (they are the render's own, or frozen)."""
    if encoder is openmetrics_latest:
        family, fmt, tail, text = _om_family, "openmetrics", "# EOF\n", False
    elif encoder is text_latest:
        family, fmt, tail, text = _text_family, "text", "", True
    else:
        raise ValueError(f"not one of this module's encoders: {encoder!r}")
    out: list[str] = []
    slices = _Slices()
    for m in metrics:
        if len(m.samples) <= SLICE_SAMPLES:
            out.append(_family_text(m, family, fmt))
        else:
            encoded: dict[str, str] | None = getattr(m, _ENCODED, None)
            done = encoded.get(fmt) if encoded is not None else None
            if done is None:
                done = await _family_sliced(m, text, slices)
                if encoded is not None:
                    encoded[fmt] = done
            out.append(done)
        await slices.tick()
    out.append(tail)
    return "".join(out).encode("utf-8")


def fast_encoder(encoder: Callable[[Any], bytes]) -> Encoder | None:
    """Our equivalent of an encoder ``prometheus_client.exposition.choose_encoder`` picked, or None.

    Only the default ``underscores`` escaping with OpenMetrics 1.0.0 or text 0.0.4/1.0.0 is covered; anything else
    (``escaping=allow-utf-8``, OpenMetrics 2.0) stays with the library.
    """
    if encoder is exposition.generate_latest:
        return text_latest
    if not isinstance(encoder, functools.partial) or encoder.args:
        return None
    kw = encoder.keywords
    if kw.get("escaping", om.UNDERSCORES) != om.UNDERSCORES:
        return None
    if encoder.func is om.generate_latest and kw.get("version", "1.0.0") == "1.0.0":
        return openmetrics_latest
    if encoder.func is exposition.generate_latest and set(kw) <= {"escaping"}:
        return text_latest
    return None

