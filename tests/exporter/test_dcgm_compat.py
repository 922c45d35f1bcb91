"""dcgm-exporter compatible names (exporter/dcgm_compat.py): DCGM's names, units and labels from the same samples as
the native families; promtool-clean; nothing for what a GPU does not report; never a failed scrape."""

from __future__ import annotations

import logging
import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuwatchd.exporter.collector import StoreCollector
from gpuwatchd.exporter.dcgm_compat import COUNTERS, NAMES, DcgmCompatCollector
from gpuwatchd.model import GpuSample, Snapshot
from gpuwatchd.store import Store

from .conftest import BUILD, UUID_A, UUID_B, promtool_check, samples, store_from_fixture

HOST = "node-7"


def compat_text(store: Store) -> str:
    reg = CollectorRegistry()
    reg.register(StoreCollector(store, build=BUILD))
    reg.register(DcgmCompatCollector(store, HOST))
    return generate_latest(reg).decode()


def dcgm(text: str) -> dict[tuple[str, str], tuple[dict[str, str], float]]:
    """(name, UUID) -> (labels, value) of the DCGM_FI_* samples."""
    return {(s.name, s.labels["UUID"]): (s.labels, s.value) for s in samples(text) if s.name.startswith("DCGM_")}


def test_names_units_and_labels_of_the_present_gpus() -> None:
    got = dcgm(compat_text(store_from_fixture("store_mixed.json")))
    labels, fb_used = got[("DCGM_FI_DEV_FB_USED", UUID_A)]
    assert labels == {"gpu": "0", "UUID": UUID_A, "pci_bus_id": "00000000:1B:00.0", "device": "nvidia0",
                      "modelName": "NVIDIA H100 80GB HBM3", "Hostname": HOST, "DCGM_FI_DRIVER_VERSION": "535.161.08"}
    assert fb_used == 40960.0  # 40 GiB in MiB
    assert got[("DCGM_FI_DEV_SM_CLOCK", UUID_A)][1] == 1980.0  # MHz
    assert got[("DCGM_FI_DEV_MEM_CLOCK", UUID_A)][1] == 2619.0
    assert got[("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", UUID_A)][1] == pytest.approx(98765432100.0)  # mJ
    assert got[("DCGM_FI_DEV_GPU_UTIL", UUID_A)][1] == 97.0  # percent
    assert got[("DCGM_FI_DEV_GPU_TEMP", UUID_A)][1] == 71.0
    assert got[("DCGM_FI_DEV_MEMORY_TEMP", UUID_A)][1] == 68.0
    assert got[("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", UUID_A)][1] == 4.0
    assert got[("DCGM_FI_DEV_GPU_UTIL", UUID_B)][0]["device"] == "nvidia1"
    # GPU B has no memory sensor and no replay counter: no sample (DCGM skips blank values), never a 0
    assert ("DCGM_FI_DEV_MEMORY_TEMP", UUID_B) not in got and ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", UUID_B) not in got
    # the lost and the removed GPU export nothing, as in the native families
    assert {u for _, u in got} == {UUID_A, UUID_B}
    assert {n for n, _ in got} <= set(NAMES)


def test_last_xid_with_code_and_message() -> None:
    got = dcgm(compat_text(store_from_fixture("store_mixed.json")))
    labels, value = got[("DCGM_FI_DEV_XID_ERRORS", UUID_A)]
    assert value == 13.0
    assert labels["err_code"] == "13" and labels["err_msg"].startswith("graphics engine exception")
    assert ("DCGM_FI_DEV_XID_ERRORS", UUID_B) not in got  # no Xid on GPU B


def test_counters_are_untyped_under_dcgms_exact_names() -> None:
    # DCGM's counters carry no _total; a client would append one to a counter (and promtool refuses it without).
    text = compat_text(store_from_fixture("store_mixed.json"))
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION untyped" in text
    assert "# TYPE DCGM_FI_DEV_FB_USED gauge" in text
    assert "_total" not in "".join(line for line in text.splitlines() if line.startswith("DCGM_"))
    assert {c.kind for c in COUNTERS} == {"gauge", "unknown"}


# promtool's lint findings that come with dcgm-exporter's own names (its renderer writes the label modelName, and
# DCGM names the PCIe replay counter ..._COUNTER): renaming them would break the dashboards compat is for, so exactly
# these are accepted on DCGM_* families; anything else (and any parse error, exit 1) fails.
DCGM_LINT = re.compile(r"^DCGM_FI_\w+ label names should be written in 'snake_case' not 'camelCase'$|"
                       r"^DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'$")


def test_compat_exposition_passes_promtool() -> None:
    text = compat_text(store_from_fixture("store_mixed.json"))
    r = promtool_check(text)
    rest = [ln for ln in r.stderr.splitlines() if not DCGM_LINT.match(ln)]
    assert r.returncode in (0, 3) and not rest and not r.stdout.strip(), r.stdout + r.stderr
    # the camelCase finding is modelName's alone, one per family
    assert {ln.split()[0] for ln in r.stderr.splitlines() if "camelCase" in ln} <= set(NAMES)
    native = "".join(ln + "\n" for ln in text.splitlines() if "DCGM_" not in ln)
    assert promtool_check(native).returncode == 0  # gpuwatchd's own families stay clean next to them


def test_families_are_reused_while_the_samples_are_the_same() -> None:
    store = store_from_fixture("store_mixed.json")
    c = DcgmCompatCollector(store, HOST)
    first = [m for m in c.collect() if m.name != "DCGM_FI_DEV_XID_ERRORS"]
    again = [m for m in c.collect() if m.name != "DCGM_FI_DEV_XID_ERRORS"]
    assert all(a is b for a, b in zip(first, again, strict=True))


def test_a_failing_build_leaves_the_families_out_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    store = Store()
    # a reading of the wrong type (a bug): the compat families are left out, the scrape goes on
    bad = GpuSample(uuid="GPU-x", index=0, clocks_hz={"sm": "fast"})  # type: ignore[dict-item]
    store.apply(Snapshot(timestamp=1.0, nvml_ok=True, gpus=(bad,)))
    c = DcgmCompatCollector(store, HOST)
    with caplog.at_level(logging.ERROR):
        assert list(c.collect()) == []
        assert list(c.collect()) == []
    assert c.errors == 2
    assert caplog.text.count("dcgm-compatible families failed") == 1  # rate-limited


def test_mig_instances_carry_their_gpus_labels_and_gpu_i_labels() -> None:
    gib = 1 << 30
    parent = GpuSample(uuid="GPU-p", index=3, name="NVIDIA A100-SXM4-80GB", pci_bus_id="00000000:4E:00.0",
                       memory_used_bytes=30 * gib, temperature_celsius=55.0)
    inst = GpuSample(uuid="MIG-1", index=3, name="NVIDIA A100-SXM4-80GB MIG 3g.40gb", memory_used_bytes=20 * gib,
                     parent_uuid="GPU-p", gpu_instance_id=2, compute_instance_id=0, profile="3g.40gb")
    store = Store()
    store.apply(Snapshot(timestamp=1.0, nvml_ok=True, driver_version="550.54.15", gpus=(parent, inst)))
    reg = CollectorRegistry()
    reg.register(DcgmCompatCollector(store, HOST))
    fb = [s for s in samples(generate_latest(reg).decode()) if s.name == "DCGM_FI_DEV_FB_USED"]
    by_instance = {s.labels.get("GPU_I_ID"): (s.labels, s.value) for s in fb}
    assert by_instance[None][1] == 30 * 1024.0 and "GPU_I_PROFILE" not in by_instance[None][0]
    labels, value = by_instance["2"]
    assert value == 20 * 1024.0
    assert labels == {"gpu": "3", "UUID": "GPU-p", "pci_bus_id": "00000000:4E:00.0", "device": "nvidia3",
                      "modelName": "NVIDIA A100-SXM4-80GB", "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "2",
                      "Hostname": HOST, "DCGM_FI_DRIVER_VERSION": "550.54.15"}
