"""Reading single values out of an ``nvidia-smi -q -x`` element tree.

nvidia-smi prints every reading as text with a unit ("24576 MiB", "35.06 W", "16x", "Active"); a reading the
driver could not give is printed as one of a handful of markers ("N/A", "[Not Supported]", ...). Each helper here
returns the value in the unit the stand-in state wants, ``None`` for "no reading", and raises ``CaptureError``
naming the element for text it does not understand (a wrong guess would replay a GPU that never existed).
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

MIB = 1024 * 1024  # nvidia-smi's "MiB" is a binary mebibyte (nvml.h reports bytes; nvidia-smi divides by 2**20)

# Text nvidia-smi prints instead of a value when the driver has no reading. Seen in the captures ("N/A",
# "Requested functionality has been deprecated" in 590.x) and in nvidia-smi's own vocabulary for failed calls
# (NVML's NOT_SUPPORTED / NO_PERMISSION / UNKNOWN return codes, nvml.h nvmlReturn_t, render as these bracketed forms).
NO_READING = frozenset(
    {
        "",
        "n/a",
        "[n/a]",
        "not supported",
        "[not supported]",
        "insufficient permissions",
        "[insufficient permissions]",
        "unknown error",
        "[unknown error]",
        "gpu requires reset",
        "[gpu requires reset]",
        "requested functionality has been deprecated",
    }
)

# Longest text of one element: the longest nvidia-smi prints is a process name (a path, PATH_MAX 4096).
MAX_TEXT = 4096

# One number as nvidia-smi prints it ("35.06", "-1", "24576"): ASCII digits, at most this many characters, and at
# most MAX_QUANTITY in size, so a reading scaled to bytes or milliwatts stays a finite integer (values near 1e308
# became inf there and an OverflowError). What the stand-in takes (u32, i64) is then checked with the field's name.
MAX_NUMBER_CHARS = 40
MAX_QUANTITY = 1e15
_NUMBER = re.compile(r"[-+]?[0-9]+(?:\.[0-9]+)?", re.ASCII)

_TRUE_WORDS = frozenset({"yes", "active", "enabled"})
_FALSE_WORDS = frozenset({"no", "not active", "disabled"})


class CaptureError(ValueError):
    """The input is not an nvidia-smi XML log that can be replayed faithfully; the message names the element."""


def where(gpu: ET.Element | None, path: str) -> str:
    """Human-readable location of an element, for error messages: ``gpu 00000000:01:00.0: pci/pci_bus``."""
    if gpu is None:
        return path
    return f"gpu {gpu.get('id', '?')}: {path}"


def text(parent: ET.Element, path: str) -> str | None:
    """Stripped text at ``path``, or None when the element is absent or holds a no-reading marker."""
    element = parent.find(path)
    if element is None or element.text is None:
        return None
    value = element.text.strip()
    if len(value) > MAX_TEXT:
        raise CaptureError(f"{path}: text too long ({len(value)} characters; at most {MAX_TEXT})")
    if value.lower() in NO_READING:
        return None
    return value


def first_text(parent: ET.Element, *paths: str) -> str | None:
    """Text of the first of ``paths`` that holds a reading (schemas renamed elements across driver versions)."""
    for path in paths:
        value = text(parent, path)
        if value is not None:
            return value
    return None


def quantity(parent: ET.Element, path: str, unit: str, *, gpu: ET.Element | None = None) -> float | None:
    """A number printed with ``unit`` ("35.06 W", "24576 MiB"), as a float; None when there is no reading."""
    value = text(parent, path)
    if value is None:
        return None
    return parse_quantity(value, unit, where(gpu, path))


def parse_quantity(value: str, unit: str, location: str) -> float:
    """Parse "<number> <unit>"; an empty ``unit`` means a bare number."""
    parts = value.split()
    expected = 2 if unit else 1
    if len(parts) != expected or (unit and parts[1] != unit):
        shown = f"'<number> {unit}'" if unit else "a bare number"
        raise CaptureError(f"{location}: expected {shown}, got {value!r}")
    if not _NUMBER.fullmatch(parts[0]):  # ASCII digits (float() takes any script's, "1_0", "nan"), bounded length
        raise CaptureError(f"{location}: {parts[0][:MAX_NUMBER_CHARS]!r} is not a number of at most "
                           f"{MAX_NUMBER_CHARS} characters (in {value[:80]!r})")
    number = float(parts[0])
    if not math.isfinite(number) or abs(number) > MAX_QUANTITY:
        raise CaptureError(f"{location}: {value[:80]!r} is outside -{MAX_QUANTITY:g}..{MAX_QUANTITY:g}")
    return number


def integer(parent: ET.Element, path: str, unit: str = "", *, gpu: ET.Element | None = None) -> int | None:
    """A whole number, optionally with a unit ("40 C", "1710 MHz", "0 %", "16x" with unit "x")."""
    value = text(parent, path)
    if value is None:
        return None
    if unit == "x" and value.endswith("x"):  # link widths print as "16x", without a space
        value = f"{value[:-1]} x"
    number = parse_quantity(value, unit, where(gpu, path))
    if not number.is_integer():
        raise CaptureError(f"{where(gpu, path)}: expected a whole number, got {value!r}")
    return int(number)


def mib_bytes(parent: ET.Element, path: str, *, gpu: ET.Element | None = None) -> int | None:
    """A "<n> MiB" reading in bytes."""
    value = quantity(parent, path, "MiB", gpu=gpu)
    return None if value is None else round(value * MIB)


def watts_mw(parent: ET.Element, path: str, *, gpu: ET.Element | None = None) -> int | None:
    """A "<n> W" reading in milliwatts (NVML's power unit)."""
    value = quantity(parent, path, "W", gpu=gpu)
    return None if value is None else round(value * 1000)


def hex_int(parent: ET.Element, path: str, *, gpu: ET.Element | None = None) -> int | None:
    """A hexadecimal field with or without "0x" ("0A831028", "1E", "0x1e")."""
    value = text(parent, path)
    if value is None:
        return None
    try:
        if len(value) > 18 or not value.isascii():  # a u64 at most, with its "0x"
            raise ValueError(value)
        return int(value, 16)
    except ValueError:
        raise CaptureError(f"{where(gpu, path)}: expected a hexadecimal number, got {value[:40]!r}") from None


def flag(parent: ET.Element, path: str, *, gpu: ET.Element | None = None) -> bool | None:
    """Yes/No, Active/Not Active, Enabled/Disabled as a bool."""
    value = text(parent, path)
    if value is None:
        return None
    word = value.lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise CaptureError(f"{where(gpu, path)}: expected Yes/No, Active/Not Active or Enabled/Disabled, got {value!r}")


def enable_pair(parent: ET.Element, current: str, pending: str, *, gpu: ET.Element | None = None) -> list[int] | None:
    """An NVML [current, pending] enable-state pair (ECC mode, MIG mode); None unless both are readable."""
    now = flag(parent, current, gpu=gpu)
    later = flag(parent, pending, gpu=gpu)
    if now is None or later is None:
        return None
    return [int(now), int(later)]
