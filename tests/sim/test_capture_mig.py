"""MIG devices of nvidia-smi XML captures (sim/capture_mig.py): the real captures in ../shared/data/captures/ (never
copied into the repo) replay their MIG devices through the stand-in and the real pynvml, read back independently."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gpuwatchd.sim.capture import state_from_xml
from gpuwatchd.sim.capture_mig import mig_uuid, profile
from gpuwatchd.sim.capture_values import CaptureError
from tests.sources.workerutil import run_worker, snap

if TYPE_CHECKING:
    from conftest import Sim, StateWriter

CAPTURES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "captures"
MIB = 2**20


def mig_captures() -> list[Any]:
    """Every capture with a non-empty <mig_devices> (xml05 is one), or a skip saying why there is none."""
    if not CAPTURES.is_dir():
        reason = f"real nvidia-smi captures not available: {CAPTURES} is absent (they live outside the repo)"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-captures")]
    found = [p for p in sorted(CAPTURES.glob("*.xml"))
             if ET.parse(p).getroot().find("gpu/mig_devices/mig_device") is not None]
    if not found:
        reason = f"no capture in {CAPTURES} lists MIG devices (<mig_devices>)"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-mig-capture")]
    return [pytest.param(p, id=p.name.split("_")[0]) for p in found]


def _int(el: ET.Element, path: str) -> int:
    found = el.find(path)
    assert found is not None and found.text is not None
    return int(found.text.split()[0])


@pytest.mark.parametrize("path", mig_captures())
def test_capture_mig_devices_read_back_through_pynvml(path: Path, sim: Sim) -> None:
    n = sim.nvml
    root = ET.parse(path).getroot()
    sim.update(state_from_xml(path))
    n.nvmlInit()
    for gpu_el, handle in zip(root.iterfind("gpu"), sim.handles(), strict=True):
        migs = list(gpu_el.iterfind("mig_devices/mig_device"))
        if not migs:
            continue
        gpu_uuid = n.nvmlDeviceGetUUID(handle)
        name = n.nvmlDeviceGetName(handle)
        assert n.nvmlDeviceGetMigMode(handle)[0] == 1
        assert n.nvmlDeviceGetMaxMigDeviceCount(handle) >= len(migs)
        for el in migs:
            h = n.nvmlDeviceGetMigDeviceHandleByIndex(handle, _int(el, "index"))
            gi, ci = _int(el, "gpu_instance_id"), _int(el, "compute_instance_id")
            assert (n.nvmlDeviceGetGpuInstanceId(h), n.nvmlDeviceGetComputeInstanceId(h)) == (gi, ci)
            assert n.nvmlDeviceGetUUID(h) == mig_uuid(gpu_uuid, gi, ci)
            mem = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
            assert (mem.total, mem.used) == (_int(el, "fb_memory_usage/total") * MIB,
                                             _int(el, "fb_memory_usage/used") * MIB)
            sms = _int(el, "device_attributes/shared/multiprocessor_count")
            assert n.nvmlDeviceGetName(h).startswith(f"{name} MIG ")
            if gpu_el.findtext("product_architecture") == "Ampere":  # 14 SMs a compute slice
                slices = min(7, sms // 14)
                gb = math.ceil(_int(el, "fb_memory_usage/total") / 1024)
                assert n.nvmlDeviceGetName(h) == f"{name} MIG {slices}g.{gb}gb"


def test_xml05_replays_four_1g20gb_mig_devices_through_the_worker(standin_libdir: Path,
                                                                  write_sim_state: StateWriter) -> None:
    path = CAPTURES / "xml05_a100-sxm4-80gb_535.54.03_mig-enabled.xml"
    if not path.is_file():
        pytest.skip(f"the MIG capture is not available: {path} is absent (captures live outside the repo)")
    code, lines, err = run_worker(standin_libdir, write_sim_state(state_from_xml(path)))
    assert code == 0, err
    gpu, *migs = snap(lines[0]).gpus
    assert (gpu.uuid, gpu.mig_mode_current, gpu.utilization_gpu_ratio) == (
        "GPU-513536b6-7d19-9063-b049-1e69664bb298", True, None)  # utilization reads N/A under MIG
    assert [(m.gpu_instance_id, m.compute_instance_id, m.profile, m.parent_uuid) for m in migs] == [
        (gi, 0, "1g.20gb", gpu.uuid) for gi in (3, 4, 5, 6)]
    assert {(m.memory_total_bytes, m.memory_used_bytes) for m in migs} == {(19968 * MIB, 12 * MIB)}
    assert all(m.processes_total == 0 for m in migs)


SYNTHETIC = """<nvidia_smi_log><driver_version>535.54.03</driver_version><cuda_version>12.2</cuda_version>
<gpu id="00000000:07:00.0"><product_name>NVIDIA H100 80GB HBM3</product_name>
<product_architecture>{arch}</product_architecture><uuid>GPU-11111111-2222-3333-4444-555555555555</uuid>
<mig_mode><current_mig>Enabled</current_mig><pending_mig>Enabled</pending_mig></mig_mode>
<mig_devices><mig_device><index>0</index><gpu_instance_id>1</gpu_instance_id><compute_instance_id>0</compute_instance_id>
<device_attributes><shared><multiprocessor_count>60</multiprocessor_count></shared></device_attributes>
<fb_memory_usage><total>40448 MiB</total><reserved>0 MiB</reserved><used>5000 MiB</used></fb_memory_usage>
</mig_device></mig_devices>
<processes><process_info><gpu_instance_id>{gi}</gpu_instance_id><compute_instance_id>0</compute_instance_id>
<pid>4242</pid><type>C</type><process_name>python</process_name><used_memory>4900 MiB</used_memory></process_info>
<process_info><gpu_instance_id>N/A</gpu_instance_id><compute_instance_id>N/A</compute_instance_id>
<pid>77</pid><type>C</type><process_name>other</process_name><used_memory>10 MiB</used_memory></process_info>
</processes></gpu></nvidia_smi_log>"""


def test_processes_are_attributed_to_their_mig_device() -> None:
    (dev,) = state_from_xml(SYNTHETIC.format(arch="Hopper", gi=1))["devices"]
    (mig,) = dev["mig_devices"]
    assert mig["profile"] == "3g.40gb"  # 60 SMs at 16 a slice, 39.5 GiB rounded up
    assert [p["pid"] for p in mig["processes"]["compute"]] == [4242]
    assert [p["pid"] for p in dev["processes"]["compute"]] == [77]


def test_a_process_in_an_unlisted_instance_is_refused() -> None:
    with pytest.raises(CaptureError, match=r"runs in GPU instance 9 compute instance 0, which <mig_devices> does"):
        state_from_xml(SYNTHETIC.format(arch="Hopper", gi=9))


def test_unknown_architecture_has_no_profile(sim: Sim) -> None:
    state = state_from_xml(SYNTHETIC.format(arch="Blackwell", gi=1))
    assert state["devices"][0]["mig_devices"][0]["profile"] is None
    sim.update(state)
    sim.nvml.nvmlInit()
    (gpu,) = sim.handles()
    assert sim.nvml.nvmlDeviceGetName(sim.nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)) == (
        "NVIDIA H100 80GB HBM3 MIG")


@pytest.mark.parametrize(("arch", "sms", "mib", "want"), [
    ("Ampere", 14, 9856, "1g.10gb"), ("Ampere", 98, 40192, "7g.40gb"),
    ("Hopper", 16, 9984, "1g.10gb"), ("Ampere", 13, 9856, None), (None, 14, 9856, None),
])
def test_profile_names(arch: str | None, sms: int, mib: int, want: str | None) -> None:
    assert profile(arch, sms, mib * MIB) == want
