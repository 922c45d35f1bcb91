"""/proc/PID/cgroup shapes of each runtime (tests/fixtures/cgroup, written from the runtimes' documented formats)
-> the container, pod and job they name; host processes name nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatchd.sources.attribution import cgroup

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "cgroup"
D = "3f2a9c1b7d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8"
C = "8d1e4b2a9f3c7e6d5b4a3928170f6e5d4c3b2a19087f6e5d4c3b2a1908f7e6d5"
P = "c0ffee00112233445566778899aabbccddeeff00112233445566778899aabbcc"
POD1 = "7d3a5c1e-2b4f-4c6d-8e9f-0a1b2c3d4e5f"
POD2 = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"

# fixture -> (container_id, runtime, pod_uid, hpc_job)
EXPECTED = {
    "docker-v2-systemd": (D, "docker", None, None),
    "docker-v1-cgroupfs": (D, "docker", None, None),
    "containerd-k8s-v2-systemd": (C, "containerd", POD1, None),
    "containerd-k8s-v1-cgroupfs": (C, "kubernetes", POD1, None),
    "crio-k8s-v2-guaranteed": (C, "cri-o", POD2, None),
    "podman-v2-rootful": (P, "podman", None, None),
    "podman-v2-rootless": (P, "podman", None, None),
    "podman-v1-cgroupfs": (P, "podman", None, None),
    "nerdctl-v2": (P, "nerdctl", None, None),
    "nspawn-v2": ("trainer-01", "systemd-nspawn", None, None),
    "slurm-v2": (None, None, None, "4242"),
    "slurm-v1": (None, None, None, "4243"),
    "host-session-v2": (None, None, None, None),
    "host-service-v2": (None, None, None, None),
    "host-v1": (None, None, None, None),
    "root-v2": (None, None, None, None),
    "crio-conmon": (None, None, None, None),  # the runtime's monitor, not the container
    "podman-conmon": (None, None, None, None),
}


def test_every_fixture_has_an_expectation() -> None:
    assert {p.stem for p in FIXTURES.glob("*.cgroup")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture(name: str) -> None:
    owner = cgroup.parse((FIXTURES / f"{name}.cgroup").read_text())
    assert (owner.container_id, owner.runtime, owner.pod_uid, owner.hpc_job) == EXPECTED[name]
    if owner.container_id is None:
        assert owner.short_id is None
    elif len(owner.container_id) == 64:
        assert owner.short_id == owner.container_id[:12]
    else:
        assert owner.short_id == owner.container_id  # a machine name is kept whole


def test_read_from_a_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text((FIXTURES / "docker-v2-systemd.cgroup").read_text())
    owner = cgroup.read(tmp_path, 4242)
    assert owner is not None and owner.short_id == D[:12]
    assert cgroup.read(tmp_path, 4243) is None  # gone, or another pid namespace: unknown, not "host"


@pytest.mark.parametrize("text", ["", "garbage\n", "0::relative/path\n", "1:cpu\n", "\x00\xff"])
def test_malformed_text_names_nothing(text: str) -> None:
    assert cgroup.parse(text) == cgroup.HOST


def test_a_hex_id_outside_a_known_parent_is_not_a_pod() -> None:
    # 64 hex under an unknown parent: a container of that cgroup parent (e.g. containerd's "default" namespace)
    owner = cgroup.parse(f"0::/default/{C}\n")
    assert owner.container_id == C and owner.runtime == "default" and owner.pod_uid is None
