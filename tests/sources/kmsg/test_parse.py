"""The kernel-log decoder on every line form it knows, and on the real captured logs (kern01, kern04)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatchd.sim.kmsg_text import parse_text
from gpuwatchd.sources.kmsg import parse as kp

CAPTURES = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "captures"


@pytest.mark.parametrize(("text", "want"), [
    ("PCI:0000:3b:00", "00000000:3B:00.0"),
    ("0000:3b:00.0", "00000000:3B:00.0"),
    ("0000:3B:00", "00000000:3B:00.0"),
    ("3b:00.1", "00000000:3B:00.1"),
    ("00000000:3B:00.0", "00000000:3B:00.0"),
    ("0001:06:1f.3", "00000001:06:1F.3"),
    ("PCI:zz:00", None),
    ("", None),
])
def test_every_pci_address_form_maps_to_the_store_form(text: str, want: str | None) -> None:
    assert kp.normalize_pci(text) == want


XID_LINES = [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
     kp.Xid("00000000:3B:00.0", 79, 1234, "python3", "GPU has fallen off the bus.")),
    ("NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
     kp.Xid("00000000:19:00.0", 48, None, None, "An uncorrectable double bit error")),
    ("NVRM: Xid (PCI:0000:19:00): 94, pid=1248209, name=python3.10, Ch 00000008",
     kp.Xid("00000000:19:00.0", 94, 1248209, "python3.10", "Ch 00000008")),
    ("NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.",
     kp.Xid("00000000:06:00.0", 79, None, None, "GPU has fallen off the bus.")),
    ("NVRM: Xid (0000:03:00): 13, 0000 00000000 0000a197 00001b0c 00000001",
     kp.Xid("00000000:03:00.0", 13, None, None, "0000 00000000 0000a197 00001b0c 00000001")),
    ("NVRM: Xid (PCI:0000:01:00): 31, pid=4242, name=train.py, Ch 00000010, intr 00000000. MMU Fault",
     kp.Xid("00000000:01:00.0", 31, 4242, "train.py", "Ch 00000010, intr 00000000. MMU Fault")),
    ("NVRM: Xid (PCI:0000:01:00): 119, pid=2, name=kworker/0:1, Timeout waiting for RPC from GSP!",
     kp.Xid("00000000:01:00.0", 119, 2, "kworker/0:1", "Timeout waiting for RPC from GSP!")),
    ("NVRM: Xid (PCI:0000:01:00): 62,", None),  # malformed rest: still an Xid with no text
]


@pytest.mark.parametrize(("line", "want"), XID_LINES)
def test_xid_forms(line: str, want: kp.Xid | None) -> None:
    got = kp.classify(line)
    if want is None:
        assert isinstance(got, kp.Xid)
        assert (got.pci_bus_id, got.code) == ("00000000:01:00.0", 62)
    else:
        assert got == want
    assert kp.kind_of(got) == "xid"


@pytest.mark.parametrize(("line", "want", "kind"), [
    ("NVRM: GPU at PCI:0000:06:00: GPU-9fe1319c-8dd3-44e4-2b74-de93f8b02c6a",
     kp.GpuAddress("00000000:06:00.0", "GPU-9fe1319c-8dd3-44e4-2b74-de93f8b02c6a"), "gpu_address"),
    ("NVRM: GPU at 0000:06:00.0 has fallen off the bus.", kp.FallenOffBus("00000000:06:00.0"), "fallen_off_bus"),
    ("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", kp.FallenOffBus("00000000:3B:00.0"), "fallen_off_bus"),
    ("NVRM: The NVIDIA GPU has fallen off the bus and is not responding", kp.FallenOffBus(None), "fallen_off_bus"),
    ("NVRM: RmInitAdapter failed! (0x22:0x56:667)", kp.RmInitFailed(None, "RmInitAdapter failed! (0x22:0x56:667)"),
     "rm_init_failed"),
    ("NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x26:0xffff:1281)",
     kp.RmInitFailed("00000000:01:00.0", "RmInitAdapter failed! (0x26:0xffff:1281)"), "rm_init_failed"),
    ("NVRM: rm_init_adapter failed for device bearing minor number 0",
     kp.RmInitFailed(None, "rm_init_adapter failed for device bearing minor number 0"), "rm_init_failed"),
    ("NVRM: API mismatch: the client has the version 535.54.03, but",
     kp.VersionMismatch("535.54.03", None, "NVRM: API mismatch: the client has the version 535.54.03, but"),
     "version_mismatch"),
    ("NVRM: API mismatch: the client 'nvidia-smi' (pid 4567) has the version 550.54.14, but",
     kp.VersionMismatch("550.54.14", None,
                        "NVRM: API mismatch: the client 'nvidia-smi' (pid 4567) has the version 550.54.14, but"),
     "version_mismatch"),
    ("NVRM: this kernel module has the version 535.129.03.  Please",
     kp.VersionMismatch(None, "535.129.03", "NVRM: this kernel module has the version 535.129.03.  Please"),
     "version_mismatch"),
    ("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  390.87  Tue Aug 21 12:33:05 PDT 2018",
     kp.DriverLoaded("390.87"), "driver_loaded"),
    ("pcieport 0000:00:1c.0: AER: Corrected error received: 0000:00:1c.0",
     kp.AerError("00000000:00:1C.0", "00000000:00:1C.0", "corrected"), "aer"),
    ("pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:01:00.0",
     kp.AerError("00000000:00:01.0", "00000000:01:00.0", "nonfatal"), "aer"),
    ("pcieport 0000:00:03.1: AER: Multiple Uncorrected (Fatal) error received: 0000:0a:00.0",
     kp.AerError("00000000:00:03.1", "00000000:0A:00.0", "fatal"), "aer"),
    ("pcieport 0000:00:01.0: AER: Corrected error received: id=0100",
     kp.AerError("00000000:00:01.0", "00000000:01:00.0", "corrected"), "aer"),
    ("pcieport 0000:00:1c.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)", None, "other"),
    ("pcieport 0000:00:1c.0: pciehp: Slot(0-1): Link Down", kp.PciehpLink("00000000:00:1C.0", "0-1", False), "pciehp"),
    ("pciehp 0000:00:1c.0:pcie004: Slot(0): Link Up", kp.PciehpLink("00000000:00:1C.0", "0", True), "pciehp"),
    ("thunderbolt 0-1: new device found, vendor=0x127 device=0x1",
     kp.Thunderbolt("0-1", True, "new device found, vendor=0x127 device=0x1"), "thunderbolt"),
    ("thunderbolt 0-1: device disconnected", kp.Thunderbolt("0-1", False, "device disconnected"), "thunderbolt"),
    ("nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context", None, "other"),
    ("usb 1-1: new high-speed USB device number 2 using xhci_hcd", None, "other"),
    ("NVRM: A GPU crash dump has been created. If possible, please run", None, "other"),
])
def test_other_line_forms(line: str, want: kp.KernelEvent | None, kind: str) -> None:
    got = kp.classify(line)
    assert got == want
    assert kp.kind_of(got) == kind


def test_kmsg_record_with_dictionary_and_escapes() -> None:
    raw = (b"4,1234,239061387,-;NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.\\x0asecond line\n"
           b" SUBSYSTEM=pci\n DEVICE=+pci:0000:06:00.0\n")
    rec = kp.parse_record(raw)
    assert rec == kp.KmsgRecord(1234, 239061387, 4, 0, "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus."
                                "\nsecond line", {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:06:00.0"})
    assert [kp.kind_of(e) for e in kp.classify_message(rec.message)] == ["xid", "other"]


@pytest.mark.parametrize("raw", [b"", b"garbage", b"a,b,c;msg", b"4,5;msg", b"\xff\xfe;"])
def test_malformed_records_are_none(raw: bytes) -> None:
    assert kp.parse_record(raw) is None


def test_format_and_parse_round_trip() -> None:
    msg = "NVRM: back\\slash and\nnewline \x01 ctl ünïcode"
    rec = kp.parse_record(kp.format_record(7, 99, msg, level=3))
    assert rec is not None
    assert (rec.seq, rec.usec, rec.level, rec.message) == (7, 99, 3, msg)


def test_non_utf8_record_is_decoded_with_replacement() -> None:
    rec = kp.parse_record(b"6,1,2,-;NVRM: Xid (PCI:0000:01:00): 13, name=\xff\xfe bad\n")
    assert rec is not None
    got = kp.classify(rec.message)
    assert isinstance(got, kp.Xid) and got.code == 13


# -- the real captured logs -------------------------------------------------------------------------------------

def _capture(prefix: str) -> Path:
    found = sorted(CAPTURES.glob(f"{prefix}_*.log")) if CAPTURES.is_dir() else []
    if not found:
        pytest.skip(f"{prefix} capture not available: {CAPTURES} is absent (../shared beside the checkout)")
    return found[0]


def _expected(text: str) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """Xids and address->UUID pairs read from the text with plain string operations, not the parser's regexes."""
    xids: list[tuple[str, int]] = []
    uuids: dict[str, str] = {}
    for line in text.splitlines():
        if "NVRM: Xid (" in line:
            inside = line.split("NVRM: Xid (", 1)[1]
            address, rest = inside.split("): ", 1)
            domain, bus, dev = address.removeprefix("PCI:").split(":")
            xids.append((f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(dev, 16):02X}.0", int(rest.split(",")[0])))
        if "NVRM: GPU at PCI:" in line:
            address, uuid = line.split("NVRM: GPU at PCI:", 1)[1].split(": ", 1)
            domain, bus, dev = address.split(":")
            uuids[f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(dev, 16):02X}.0"] = uuid.strip()
    return xids, uuids


@pytest.mark.parametrize("prefix", ["kern01", "kern04"])
def test_real_logs_every_xid_and_uuid_exact(prefix: str) -> None:
    path = _capture(prefix)
    data = path.read_bytes()
    want_xids, want_uuids = _expected(data.decode("utf-8", "replace"))
    assert want_xids, f"{path.name} has Xid lines"
    events = [e for entry in parse_text(data) for e in kp.classify_message(entry.message) if e is not None]
    assert [(e.pci_bus_id, e.code) for e in events if isinstance(e, kp.Xid)] == want_xids
    assert {e.pci_bus_id: e.uuid for e in events if isinstance(e, kp.GpuAddress)} == want_uuids


def test_kern01_pid_and_process_of_the_contained_error() -> None:
    data = _capture("kern01").read_bytes()
    xids = [e for entry in parse_text(data) for e in kp.classify_message(entry.message) if isinstance(e, kp.Xid)]
    assert [x.code for x in xids[:3]] == [48, 63, 94]
    assert all(x.pid is None and x.process is None for x in xids[:3])  # pid='<unknown>', name=<unknown>
    assert {(x.pid, x.process) for x in xids[3:]} == {(1248209, "python3.10")}
    assert xids[0].text.startswith("An uncorrectable double bit error")


def test_kern04_egpu_unplug_sequence() -> None:
    data = _capture("kern04").read_bytes()
    events = [e for entry in parse_text(data) for e in kp.classify_message(entry.message) if e is not None]
    kinds = [kp.kind_of(e) for e in events]
    assert kinds == ["driver_loaded", "gpu_address", "xid", "fallen_off_bus", "aer"]  # nvidia-modeset: not NVRM
    assert events[3] == kp.FallenOffBus("00000000:06:00.0")
    assert events[4] == kp.AerError("00000000:00:1C.0", "00000000:00:1C.0", "corrected")
