"""Kernel-log lines that matter for GPUs, decoded by pure functions (no I/O; docs/kernel-log.md).

Two layers: :func:`parse_record` splits one ``/dev/kmsg`` record (``prio,seq,usec,flags;message`` plus dictionary
lines `` SUBSYSTEM=...``) into a :class:`KmsgRecord`, and :func:`classify` turns one message line into a typed
event (an Xid, an address -> UUID mapping, a fall off the bus, an AER error, ...) or ``None`` for the lines a GPU
monitor ignores. Both the live ring and ``gpuwatchd sim --kernel-log`` go through these same functions.

The line forms come from real logs (kern01: driver 5xx with ``pid='<unknown>', name=<unknown>``; kern04: driver
390 without pid/name) and from the kernel's own printk formats (drivers/pci/pcie/aer.c, pciehp_ctrl.c,
drivers/thunderbolt/tb.c).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuwatchd.textint import ascii_uint

AerSeverity = Literal["corrected", "nonfatal", "fatal"]
# Xid codes the driver can print: NVIDIA's catalog and nverror.h (ROBUST_CHANNEL_LAST_ERROR) end in the 150s today;
# 1..255 leaves newer drivers room. A code outside it is a corrupt or forged line, counted as malformed.
XID_MIN, XID_MAX = 1, 255
MAX_PID = 4_194_304  # the kernel's PID_MAX_LIMIT (2^22)
# Bounds on the text a record carries into labels, alerts and the status API (a real Xid text is under ~200 chars,
# a process name at most 15 bytes: TASK_COMM_LEN).
MAX_TEXT_CHARS = 512
MAX_NAME_CHARS = 64
MAX_VERSION_CHARS = 32


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One record of the kernel ring buffer."""

    seq: int
    usec: int  # printk time: microseconds since boot (CLOCK_MONOTONIC, suspend excluded)
    level: int  # syslog level 0 (emerg) .. 7 (debug)
    facility: int  # 0 = kernel
    message: str  # unescaped; may hold several lines ("\n") for a multi-line printk
    fields: Mapping[str, str] = field(default_factory=dict)  # SUBSYSTEM=pci, DEVICE=+pci:0000:06:00.0


@dataclass(frozen=True, slots=True)
class Xid:
    pci_bus_id: str  # the store's form, 00000000:3B:00.0
    code: int
    pid: int | None
    process: str | None
    text: str


@dataclass(frozen=True, slots=True)
class Sxid:
    """An NVSwitch error's headline line (the one that says Fatal or Non-fatal; its Severity / Data lines that
    follow with the same code are :class:`SxidDetail`)."""

    switch: str  # the NVSwitch's PCI address, store form (00000000:05:00.0)
    code: int
    fatal: bool
    text: str


@dataclass(frozen=True, slots=True)
class SxidDetail:
    """A continuation line of an SXid report (``Severity 0 Engine instance ...``, ``Data {...}``): not a new error."""

    switch: str
    code: int


@dataclass(frozen=True, slots=True)
class GpuAddress:
    pci_bus_id: str
    uuid: str


@dataclass(frozen=True, slots=True)
class FallenOffBus:
    pci_bus_id: str | None  # None when the line names no address


@dataclass(frozen=True, slots=True)
class RmInitFailed:
    pci_bus_id: str | None
    text: str


@dataclass(frozen=True, slots=True)
class VersionMismatch:
    client_version: str | None
    kernel_version: str | None
    text: str


@dataclass(frozen=True, slots=True)
class DriverLoaded:
    version: str


@dataclass(frozen=True, slots=True)
class AerError:
    port: str  # the device that printed the line (a root or downstream port), store form
    source: str | None  # the device the error came from ("error received: 0000:01:00.0"), store form
    severity: AerSeverity


@dataclass(frozen=True, slots=True)
class PciehpLink:
    port: str
    slot: str
    up: bool


@dataclass(frozen=True, slots=True)
class Malformed:
    """A line in a GPU-relevant form whose numbers are not numbers (non-ASCII digits, too long, out of range)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Thunderbolt:
    device: str  # the thunderbolt bus name, e.g. "0-1"
    connected: bool
    detail: str


KernelEvent = (
    Xid | Sxid | SxidDetail | GpuAddress | FallenOffBus | RmInitFailed | VersionMismatch | DriverLoaded | AerError
    | PciehpLink | Thunderbolt | Malformed
)

_KIND: dict[type, str] = {
    Xid: "xid", Sxid: "sxid", SxidDetail: "sxid",
    GpuAddress: "gpu_address", FallenOffBus: "fallen_off_bus", RmInitFailed: "rm_init_failed",
    VersionMismatch: "version_mismatch", DriverLoaded: "driver_loaded", AerError: "aer", PciehpLink: "pciehp",
    Thunderbolt: "thunderbolt", Malformed: "malformed",
}


def kind_of(event: KernelEvent | None) -> str:
    """The ``kind`` label a line is counted under."""
    return "other" if event is None else _KIND[type(event)]


# -- PCI addresses ------------------------------------------------------------------------------------------------

# [PCI:][domain:]bus:device[.function], hex; the kernel prints a 4-digit domain, NVML an 8-digit one.
_PCI = r"(?:PCI:)?(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_PCI_PARTS = re.compile(r"^(?:PCI:)?(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?$")


def normalize_pci(text: str) -> str | None:
    """Any kernel or NVML spelling of a PCI address -> the store's ``00000000:3B:00.0``; None if not one.

    ``PCI:0000:3b:00`` (NVRM, no function: the GPU's function 0), ``0000:3b:00.0`` (sysfs), ``3b:00.0`` (no
    domain: domain 0) and ``00000000:3B:00.0`` (NVML) all give the same string.
    """
    m = _PCI_PARTS.match(text.strip())
    if m is None:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):08X}:{int(bus, 16):02X}:{int(dev, 16):02X}.{int(fn or '0')}"


# -- records ------------------------------------------------------------------------------------------------------

_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def unescape(text: str) -> str:
    r"""/dev/kmsg writes non-printable bytes (and a backslash) as ``\xNN``; undo that."""
    if "\\x" not in text:
        return text
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)


def escape(text: str) -> str:
    r"""The inverse of :func:`unescape`, as the kernel does it: newlines, control bytes and ``\`` as ``\xNN``."""
    return "".join(f"\\x{ord(c):02x}" if (ord(c) < 32 and c != "\t") or c == "\\" or ord(c) == 127 else c
                   for c in text)


def parse_record(raw: bytes | str) -> KmsgRecord | None:
    """One ``/dev/kmsg`` record; None for a malformed one (never raises). Bytes are decoded per record with
    replacement, so one non-UTF-8 record cannot break the others."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    head, sep, rest = text.partition(";")
    if not sep:
        return None
    parts = head.split(",", 3)
    if len(parts) < 3:
        return None
    prio, seq, usec = ascii_uint(parts[0], 4), ascii_uint(parts[1]), ascii_uint(parts[2])
    if prio is None or seq is None or usec is None:
        return None
    message, *dict_lines = rest.rstrip("\n").split("\n")
    fields: dict[str, str] = {}
    for line in dict_lines:
        if line.startswith(" ") and "=" in line:
            key, _, value = line[1:].partition("=")
            fields[key] = value
    return KmsgRecord(seq=seq, usec=usec, level=prio & 7, facility=prio >> 3, message=unescape(message),
                      fields=fields)


def format_record(seq: int, usec: int, message: str, *, level: int = 4, facility: int = 0) -> bytes:
    """A record as /dev/kmsg would hand it out (what the sim's replay writes)."""
    return f"{(facility << 3) | level},{seq},{usec},-;{escape(message)}\n".encode()


# -- classification -----------------------------------------------------------------------------------------------

# NVRM: Xid (PCI:0000:19:00): 94, pid=1248209, name=python3.10, Ch 00000008
# NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error ...
# NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.            (drivers before ~460: no pid/name)
# NVRM: Xid (0000:03:00): 13, 0000 00000000 0000a197 00001b0c 00000001    (very old drivers: no "PCI:")
# The code and pid are taken as any text up to the separator and checked by ascii_uint (bounded, ASCII only).
_XID = re.compile(rf"NVRM: Xid \(({_PCI})\): ([^,\s]+)(?:,\s*(.*))?$")
_PID_NAME = re.compile(r"^pid=(?:'?<unknown>'?|'?([^',]*)'?), name=(?:<unknown>|'?([^,]*?)'?)(?:, (.*))?$")
# NVRM: GPU at PCI:0000:06:00: GPU-9fe1319c-8dd3-44e4-2b74-de93f8b02c6a
_GPU_AT = re.compile(rf"NVRM: GPU at ({_PCI}): (GPU-[0-9a-fA-F-]{{1,64}})(?![0-9a-fA-F-])")
# NVRM: GPU at 0000:06:00.0 has fallen off the bus.  /  NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.
_FALLEN_AT = re.compile(rf"NVRM: GPU (?:at )?({_PCI}):? (?:GPU )?has fallen off the bus")
_FALLEN = re.compile(r"(?:GPU )?has fallen off the bus", re.IGNORECASE)
# NVRM: RmInitAdapter failed! (0x22:0x56:667)  /  NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (...)
# NVRM: rm_init_adapter failed for device bearing minor number 0
_RM_INIT = re.compile(rf"NVRM: (?:GPU ({_PCI}): )?(RmInitAdapter failed.*|rm_init_adapter failed.*)$")
# NVRM: API mismatch: the client has the version 535.54.03, but
# NVRM: API mismatch: the client 'nvidia-smi' (pid 1234) has the version 550.54.14, but
# NVRM: this kernel module has the version 535.129.03.  Please
_API_CLIENT = re.compile(
    r"NVRM: API mismatch: the client (?:'[^']*' \(pid [0-9]+\) )?has the version ([\w.-]{1,32})", re.ASCII
)
_API_KERNEL = re.compile(r"NVRM: this kernel module has the version ([\w.-]{1,32}?)\.?\s", re.ASCII)
_LOADED = re.compile(r"NVRM: loading NVIDIA UNIX .*?Kernel Module\s+([0-9.]{1,32})(?![0-9.])")
# pcieport 0000:00:1c.0: AER: Corrected error received: 0000:00:1c.0
# pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:01:00.0
# pcieport 0000:00:03.1: AER: Multiple Uncorrected (Fatal) error received: 0000:0a:00.0
# pcieport 0000:00:01.0: AER: Corrected error received: id=0008      (kernels before 4.17: a bus/devfn id)
_AER = re.compile(
    rf"^\S+ ({_PCI}): AER: (?:Multiple )?(Corrected|Uncorrected \(Non-Fatal\)|Uncorrected \(Fatal\)) error "
    rf"received: (?:({_PCI})|id=([0-9a-fA-F]{{4}}))"
)
# pcieport 0000:00:1c.0: pciehp: Slot(0-1): Link Down        (kernels >= 4.19)
# pciehp 0000:00:1c.0:pcie004: Slot(0): Link Up               (older)
_PCIEHP = re.compile(rf"^\S+ ({_PCI})(?::pcie[0-9]+)?: (?:pciehp: )?Slot\(([^)]{{0,32}})\): Link (Up|Down)")
# thunderbolt 0-1: new device found, vendor=0x127 device=0x1   /  thunderbolt 0-1: device disconnected
_TB_NEW = re.compile(r"^thunderbolt ([0-9]{1,4}-[0-9a-fA-F]{1,16}(?:\.[0-9]{1,4})?): (new device found.*)$")
_TB_GONE = re.compile(r"^thunderbolt ([0-9]{1,4}-[0-9a-fA-F]{1,16}(?:\.[0-9]{1,4})?): (device disconnected.*)$")
_AER_SEVERITY: dict[str, AerSeverity] = {
    "Corrected": "corrected", "Uncorrected (Non-Fatal)": "nonfatal", "Uncorrected (Fatal)": "fatal",
}


def _pci(text: str | None) -> str | None:
    return normalize_pci(text) if text else None


def _cut(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


# nvidia-nvswitch1: SXid (PCI:0000:02:00.0): 22013, Non-fatal, Link 00 Minion Link DLREQ interrupt  (nvtrust#124)
# nvidia-nvswitch1: SXid (PCI:0000:02:00.0): 22013, Severity 0 Engine instance 00 Sub-engine instance 00
# nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a, ...}             (gpud#338)
# The driver prints the code as %05d; the headline says Fatal or Non-fatal, the lines after it repeat the code.
_SXID = re.compile(rf"nvidia-nvswitch[0-9]*: SXid \(({_PCI})\): ([^,\s]+)(?:,\s*(.*))?$")
_SXID_SEVERITY = re.compile(r"(Fatal|Non-fatal)\b", re.IGNORECASE)
SXID_DIGITS = 5  # %05d: the Fabric Manager guide's codes run 1xxxx..2xxxx


def parse_xid(line: str) -> Xid | Malformed | None:
    """An Xid line; :class:`Malformed` when its code or pid is not a plausible number; None for other lines."""
    m = _XID.search(line)
    if m is None:
        return None
    address = _pci(m.group(1))
    if address is None:
        return None
    code = ascii_uint(m.group(2), 3)
    if code is None or not XID_MIN <= code <= XID_MAX:
        return Malformed(f"Xid code not in {XID_MIN}..{XID_MAX}")
    rest = (m.group(3) or "").strip()
    pid: int | None = None
    process: str | None = None
    pm = _PID_NAME.match(rest)
    if pm is not None:
        if pm.group(1):
            pid = ascii_uint(pm.group(1), 7)
            if pid is None or pid > MAX_PID:
                return Malformed("pid not a number")
        process = _cut(pm.group(2), MAX_NAME_CHARS) if pm.group(2) else None
        rest = (pm.group(3) or "").strip()
    return Xid(address, code, pid, process, _cut(rest))


def parse_sxid(line: str) -> Sxid | SxidDetail | Malformed | None:
    """An NVSwitch SXid line; :class:`Malformed` when its code is not a plausible number; None for other lines."""
    m = _SXID.search(line)
    if m is None:
        return None
    switch = _pci(m.group(1))
    code = ascii_uint(m.group(2), SXID_DIGITS)
    if switch is None or code is None or code < 1:
        return Malformed(f"SXid code not 1..{SXID_DIGITS} digits")
    rest = m.group(3) or ""
    word = _SXID_SEVERITY.match(rest)
    if word is None:
        return SxidDetail(switch, code)
    return Sxid(switch, code, word.group(1).lower() == "fatal", _cut(rest))


def classify(line: str) -> KernelEvent | None:
    """The GPU-relevant meaning of one log line (message text only, no timestamp); None for any other line."""
    line = line.rstrip()
    if "NVRM" in line:
        return _classify_nvrm(line)
    if "SXid" in line:
        return parse_sxid(line)
    if "AER:" in line:
        m = _AER.search(line)
        if m is not None:
            port = _pci(m.group(1))
            assert port is not None  # the pattern only matches addresses
            source = _pci(m.group(3)) if m.group(3) else _aer_id(port, m.group(4))
            return AerError(port, source, _AER_SEVERITY[m.group(2)])
        return None
    if "Slot(" in line:
        m = _PCIEHP.search(line)
        if m is not None:
            port = _pci(m.group(1))
            assert port is not None
            return PciehpLink(port, m.group(2), m.group(3) == "Up")
        return None
    if line.startswith("thunderbolt "):
        m = _TB_NEW.match(line)
        if m is not None:
            return Thunderbolt(m.group(1), True, _cut(m.group(2)))
        m = _TB_GONE.match(line)
        if m is not None:
            return Thunderbolt(m.group(1), False, _cut(m.group(2)))
    return None


def _classify_nvrm(line: str) -> KernelEvent | None:
    xid = parse_xid(line)
    if xid is not None:
        return xid
    m = _GPU_AT.search(line)
    if m is not None:
        address = _pci(m.group(1))
        if address is not None:
            return GpuAddress(address, m.group(2))
    m = _FALLEN_AT.search(line)
    if m is not None:
        return FallenOffBus(_pci(m.group(1)))
    if _FALLEN.search(line):
        return FallenOffBus(None)
    m = _RM_INIT.search(line)
    if m is not None:
        return RmInitFailed(_pci(m.group(1)), _cut(m.group(2)))
    m = _API_CLIENT.search(line)
    if m is not None:
        return VersionMismatch(m.group(1), None, _cut(line[line.index("NVRM:"):]))
    m = _API_KERNEL.search(line + " ")
    if m is not None:
        return VersionMismatch(None, m.group(1), _cut(line[line.index("NVRM:"):]))
    m = _LOADED.search(line)
    if m is not None:
        return DriverLoaded(m.group(1))
    return None


def _aer_id(port: str, hex_id: str | None) -> str | None:
    """Pre-4.17 kernels name the source as ``id=BBDD`` (bus, devfn) in the port's PCI domain."""
    if hex_id is None:
        return None
    value = int(hex_id, 16)
    bus, devfn = value >> 8, value & 0xFF
    return f"{port[:8]}:{bus:02X}:{devfn >> 3:02X}.{devfn & 7}"


def classify_message(message: str) -> list[KernelEvent | None]:
    """Each line of a (possibly multi-line) record's message, classified."""
    return [classify(line) for line in message.split("\n") if line.strip()]
