"""nvidia-smi XML -> stand-in state, on hand-written fixtures whose values are known (tests/sim/fixtures/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.sim.capture import CaptureError, describe_capture, parse_cuda_version, state_from_xml

FIXTURES = Path(__file__).parent / "fixtures"
MIB = 1024 * 1024


def device(name: str, index: int = 0) -> dict[str, Any]:
    devices: list[dict[str, Any]] = state_from_xml(FIXTURES / name)["devices"]
    return devices[index]


def variant(name: str, old: str, new: str) -> str:
    """A fixture's text with every occurrence of a substring (it must occur) replaced, for the failure tests."""
    source = (FIXTURES / name).read_text()
    assert old in source, f"{old!r} not in {name}"
    return source.replace(old, new)


class TestOldSchema:
    """Driver 418 layout: clocks_throttle_reasons, per-location ECC with totals, power_readings, no fb reserve."""

    def test_system_versions(self) -> None:
        state = state_from_xml(FIXTURES / "old_schema_418.xml")
        assert state["driver_version"] == "418.87.01"
        assert state["cuda_driver_version"] == 10010
        assert state["nvml_version"] == "10.418.87.01"

    def test_identity_and_pci(self) -> None:
        gpu = device("old_schema_418.xml")
        assert (gpu["uuid"], gpu["name"], gpu["serial"], gpu["minor_number"]) == (
            "GPU-01d5c4e3-0000-4000-8000-000000000418",
            "Tesla V100-PCIE-32GB",
            "0323918012345",
            2,
        )
        assert gpu["pci"] == {
            "domain": 0,
            "bus": 0x3B,
            "device": 0,
            "pci_device_id": 0x1DB610DE,
            "pci_subsystem_id": 0x124A10DE,
        }

    def test_memory_without_reserved_line_has_zero_reserve(self) -> None:
        # 418 printed NVML v1 "used", which already contains the reserve: replaying it as reserve 0 keeps v1 exact.
        assert device("old_schema_418.xml")["memory"] == {"total": 32510 * MIB, "reserved": 0, "used": 20480 * MIB}

    def test_throttle_reasons_map_to_nvml_bits_and_na_is_unsupported(self) -> None:
        gpu = device("old_schema_418.xml")
        # Active: sw_power_cap (0x4) and sw_thermal_slowdown (0x20). hw_thermal / hw_power_brake read N/A, the
        # display reason is absent: neither is in the supported mask.
        assert gpu["clocks_event_reasons"] == 0x4 | 0x20
        assert gpu["supported_clocks_event_reasons"] == 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x20
        assert gpu["violation_ns"] == {}

    def test_ecc_totals_come_from_total_elements(self) -> None:
        gpu = device("old_schema_418.xml")
        assert gpu["ecc_mode"] == [1, 0]
        assert gpu["ecc_errors"] == {
            "corrected_volatile": 6,
            "uncorrected_volatile": 0,
            "corrected_aggregate": 40,
            "uncorrected_aggregate": 2,
        }

    def test_retired_pages_keep_printed_addresses_and_synthesize_the_rest_distinct(self) -> None:
        pages = device("old_schema_418.xml")["retired_pages"]
        assert pages["pending"] is True
        assert len(pages["sbe"]) == 2 and len(pages["dbe"]) == 1
        assert pages["sbe"][0] == 0xC8A01
        everything = pages["sbe"] + pages["dbe"]
        assert len(set(everything)) == len(everything)

    def test_power_prefers_enforced_limit(self) -> None:
        gpu = device("old_schema_418.xml")
        assert gpu["power_usage_mw"] == 248510
        assert gpu["power_limit_mw"] == 240000  # enforced 240 W, not the 250 W management limit
        assert gpu["power_constraints_mw"] == [100000, 250000]
        assert gpu["energy_mj"] is None

    def test_link_thermal_clocks_and_process(self) -> None:
        gpu = device("old_schema_418.xml")
        assert gpu["pcie"] == {
            "gen": 2,
            "max_gen": 3,
            "gpu_max_gen": None,  # 418 prints no GPU-side maximum
            "width": 16,
            "max_width": 16,
            "tx_kbps": 1200,
            "rx_kbps": 800,
            "replay_counter": 7,
        }
        assert gpu["temperature"] == 71
        assert gpu["temperature_thresholds"] == {"shutdown": 90, "slowdown": 87, "mem_max": 85, "gpu_max": 83}
        assert gpu["clocks_mhz"] == {"graphics": 1245, "sm": 1245, "memory": 877, "video": 1117}
        assert gpu["max_clocks_mhz"] == {"graphics": 1380, "sm": 1380, "memory": 877, "video": 1237}
        assert gpu["pstate"] == 2
        assert gpu["fans"] is None
        assert gpu["utilization"] == {"gpu": 97, "memory": 41}
        assert gpu["mig_mode"] is None
        assert gpu["remapped_rows"] is None
        assert gpu["processes"] == {
            "compute": [{"pid": 31337, "used_memory": 20470 * MIB, "name": "/usr/bin/python3"}],
            "graphics": [],
        }


class TestNewSchema:
    """Driver 590 layout: clocks_event_reasons + counters, gpu_power_readings, sram parity/secded, MIG."""

    def test_event_reasons_and_counters(self) -> None:
        gpu = device("new_schema_590.xml")
        assert gpu["clocks_event_reasons"] == 0x8 | 0x80  # hw_slowdown + hw_power_brake_slowdown
        assert gpu["supported_clocks_event_reasons"] == 0x1FF
        # printed in microseconds; NVML's violation times are nanoseconds. hw_* counters have no perf policy.
        assert gpu["violation_ns"] == {"power": 1500 * 1000, "thermal": 250 * 1000, "sync_boost": 0}

    def test_average_draw_is_power_usage_and_current_limit_is_the_limit(self) -> None:
        gpu = device("new_schema_590.xml")
        assert gpu["power_usage_mw"] == 633470
        assert gpu["power_limit_mw"] == 700000
        assert gpu["power_constraints_mw"] == [200000, 700000]

    def test_ecc_sums_sram_and_dram_parts_skipping_na_and_flags(self) -> None:
        assert device("new_schema_590.xml")["ecc_errors"] == {
            "corrected_volatile": 3 + 10,
            "uncorrected_volatile": 1 + 2,  # dram_uncorrectable is N/A
            "corrected_aggregate": 30 + 100,
            "uncorrected_aggregate": 4 + 5 + 6,
        }

    def test_remapped_rows_mig_link_and_pci_domain(self) -> None:
        gpu = device("new_schema_590.xml")
        assert gpu["remapped_rows"] == {"correctable": 1, "uncorrectable": 4, "pending": True, "failure": False}
        assert gpu["retired_pages"] is None
        assert gpu["mig_mode"] == [1, 0]
        assert gpu["pci"]["domain"] == 1 and gpu["pci"]["bus"] == 0xC1
        assert gpu["pci"]["pci_device_id"] == 0x233010DE  # printed with a 0x prefix
        assert gpu["pcie"]["gpu_max_gen"] == 5 and gpu["pcie"]["max_gen"] == 4
        assert gpu["pcie"]["width"] == 4 and gpu["pcie"]["replay_counter"] == 82
        assert gpu["pcie"]["rx_kbps"] is None and gpu["pcie"]["tx_kbps"] == 52000
        assert gpu["clocks_mhz"]["video"] is None and gpu["clocks_mhz"]["graphics"] == 86
        assert gpu["fans"] == [45]
        assert gpu["memory"] == {"total": 81559 * MIB, "reserved": 591 * MIB, "used": 40960 * MIB}

    def test_process_types(self) -> None:
        processes = device("new_schema_590.xml")["processes"]
        assert [p["pid"] for p in processes["compute"]] == [4242, 5151, 6000]  # C, C+G, M+C
        assert [p["pid"] for p in processes["graphics"]] == [5151]  # C+G is listed by both NVML calls
        assert processes["compute"][0]["used_memory"] == 30720 * MIB


class TestNotAvailable:
    def test_every_optional_reading_is_none(self) -> None:
        state = state_from_xml(FIXTURES / "all_na.xml")
        assert state["cuda_driver_version"] is None and state["nvml_version"] is None
        gpu = state["devices"][0]
        for key in (
            "serial",
            "minor_number",
            "memory",
            "utilization",
            "temperature",
            "power_usage_mw",
            "power_limit_mw",  # [Insufficient Permissions] is no reading too
            "power_constraints_mw",
            "energy_mj",
            "clocks_event_reasons",
            "supported_clocks_event_reasons",
            "fans",  # [Unknown Error]
            "ecc_mode",
            "ecc_errors",
            "retired_pages",
            "remapped_rows",
            "mig_mode",
        ):
            assert gpu[key] is None, key
        for group in ("temperature_thresholds", "clocks_mhz", "max_clocks_mhz", "pcie"):
            assert set(gpu[group].values()) == {None}, group
        assert gpu["pci"] == {"domain": 0, "bus": 6, "device": 0}  # ids N/A: left to the writer's default
        assert gpu["processes"] == {"compute": [], "graphics": []}
        assert gpu["pstate"] == 32  # "Unknown" is NVML_PSTATE_UNKNOWN, a value NVML returns with success


class TestWddm:
    def test_processes_listed_with_unknown_memory(self) -> None:
        processes = device("wddm_processes.xml")["processes"]
        assert [(p["pid"], p["used_memory"]) for p in processes["compute"]] == [(1234, None), (9876, None)]
        assert [(p["pid"], p["used_memory"]) for p in processes["graphics"]] == [(1234, None), (5550, None)]
        assert processes["graphics"][1]["name"] == r"C:\Program Files\Mozilla Firefox\firefox.exe"


class TestMultiGpu:
    def test_two_gpus_in_dump_order(self) -> None:
        devices = state_from_xml(FIXTURES / "two_gpus.xml")["devices"]
        assert [d["uuid"] for d in devices] == [
            "GPU-11111111-0002-4000-8000-000000000017",
            "GPU-22222222-0002-4000-8000-0000000000ca",
        ]
        assert [d["pci"]["bus"] for d in devices] == [0x17, 0xCA]
        assert [d["memory"]["used"] for d in devices] == [0, 18000 * MIB]
        assert devices[1]["processes"]["compute"][0]["pid"] == 777

    def test_describe_capture_one_line_per_gpu(self) -> None:
        assert describe_capture(FIXTURES / "two_gpus.xml").splitlines() == [
            "0: NVIDIA L4 GPU-11111111-0002-4000-8000-000000000017 00000000:17:00.0",
            "1: NVIDIA L4 GPU-22222222-0002-4000-8000-0000000000ca 00000000:CA:00.0",
        ]

    def test_text_input_equals_path_input(self) -> None:
        path = FIXTURES / "two_gpus.xml"
        assert state_from_xml(path.read_text()) == state_from_xml(str(path))


@pytest.mark.parametrize(("value", "expected"), [("12.2", 12020), ("13.1", 13010), ("10.1", 10010), ("11.10", 11100)])
def test_cuda_version(value: str, expected: int) -> None:
    assert parse_cuda_version(value) == expected


V100 = "gpu 00000000:3B:00.0: "  # how errors name the GPU of old_schema_418.xml


@pytest.mark.parametrize(
    ("name", "old", "new", "message"),
    [
        ("old_schema_418.xml", "<used>20480 MiB</used>", "<used>20480 GiB</used>", V100 + "fb_memory_usage/used"),
        ("old_schema_418.xml", "<gpu_temp>71 C</gpu_temp>", "<gpu_temp>hot C</gpu_temp>", "'hot' is not a number"),
        ("old_schema_418.xml", "<performance_state>P2", "<performance_state>Turbo", V100 + "performance_state"),
        ("old_schema_418.xml", "<pci_bus>3B</pci_bus>", "<pci_bus>3G</pci_bus>", V100 + "pci/pci_bus"),
        ("old_schema_418.xml", "<current_ecc>Enabled", "<current_ecc>Maybe", V100 + "ecc_mode/current_ecc"),
        ("old_schema_418.xml", "<type>C</type>", "<type>X</type>", "unknown process type 'X'"),
        ("old_schema_418.xml", "<gpu_temp>71 C</gpu_temp>", "<gpu_temp>71.5 C</gpu_temp>", "expected a whole number"),
        ("old_schema_418.xml", "<max_link_width>16x<", "<max_link_width>wide<", V100 + "pci/pci_gpu_link_info"),
        (
            "old_schema_418.xml",
            "<pid>31337</pid>",
            "<pid>N/A</pid>",
            V100 + r"processes/process_info\[1\]: a process needs a pid",
        ),
        (
            "old_schema_418.xml",
            "clocks_throttle_reason_sync_boost>",
            "clocks_throttle_reason_warp_drive>",
            "warp_drive",
        ),
        (
            "old_schema_418.xml",
            "<uuid>GPU-01d5c4e3-0000-4000-8000-000000000418</uuid>",
            "<uuid>N/A</uuid>",
            V100 + "uuid",
        ),
        ("old_schema_418.xml", "<cuda_version>10.1", "<cuda_version>ten", "cuda_version: expected"),
        (
            "old_schema_418.xml",
            "nvidia_smi_log>",
            "other_log>",
            "root element is <other_log>, expected <nvidia_smi_log>",
        ),
        ("old_schema_418.xml", "</nvidia_smi_log>", "", "not well-formed XML"),
        (
            "two_gpus.xml",
            "GPU-22222222-0002-4000-8000-0000000000ca",
            "GPU-11111111-0002-4000-8000-000000000017",
            "appears on two <gpu> elements",
        ),
    ],
)
def test_unreadable_values_fail_naming_the_element(name: str, old: str, new: str, message: str) -> None:
    with pytest.raises(CaptureError, match=message):
        state_from_xml(variant(name, old, new))


def test_missing_file_is_a_capture_error(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="cannot read the capture"):
        state_from_xml(tmp_path / "absent.xml")


def test_binary_file_is_a_capture_error(tmp_path: Path) -> None:
    path = tmp_path / "dump.xml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CaptureError, match="cannot read the capture"):
        state_from_xml(path)


def test_no_gpus_gives_an_empty_device_list() -> None:
    state = state_from_xml(
        '<?xml version="1.0" ?><nvidia_smi_log><driver_version>550.54.15</driver_version>'
        "<attached_gpus>0</attached_gpus></nvidia_smi_log>"
    )
    assert state["devices"] == [] and state["driver_version"] == "550.54.15"
