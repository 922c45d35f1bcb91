"""NvmlSupervisor end to end: real worker processes against the stand-in driver, real sysfs-like trees."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuwatchd.config.loader import NvmlConfig, ProcessesConfig, SysfsConfig
from gpuwatchd.model import LinkSample, Snapshot
from gpuwatchd.runtime.clock import ManualClock, RealClock, ScaledClock
from gpuwatchd.sim.player import state_at
from gpuwatchd.sim.scenario import load_scenario
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_device, make_state
from gpuwatchd.sim.worker import WORKER_MODULE as SIM_WORKER_MODULE
from gpuwatchd.sources.nvml.supervisor import NvmlSupervisor
from gpuwatchd.store import Store

StateWriter = Callable[[dict[str, Any]], Path]
WAIT = 30.0  # upper bound for anything to happen; tests normally finish far sooner


def fast_nvml(libdir: Path | None, **kw: Any) -> NvmlConfig:
    base: dict[str, Any] = {"poll_interval": 0.05, "poll_timeout": 0.5, "kill_grace": 0.5,
                            "restart_backoff_initial": 0.01, "restart_backoff_max": 0.05, "library_path": libdir}
    base.update(kw)
    return NvmlConfig(**base)


def plug(root: Path, bdf: str) -> None:
    """A minimal NVIDIA VGA function under a sysfs-like root."""
    d = root / "sys/bus/pci/devices" / bdf
    d.mkdir(parents=True, exist_ok=True)
    (d / "vendor").write_text("0x10de\n")
    (d / "class").write_text("0x030000\n")
    (d / "current_link_speed").write_text("8.0 GT/s PCIe\n")
    (d / "current_link_width").write_text("4\n")


def unplug(root: Path, bdf: str) -> None:
    shutil.rmtree(root / "sys/bus/pci/devices" / bdf)


class Harness:
    def __init__(self, nvml: NvmlConfig, state: Path, sysfs_root: Path, *, clock: Any = None, top_n: int = 5,
                 python: str | None = None) -> None:
        self.store = Store()
        self.snaps: list[Snapshot] = []
        self.stale: list[str] = []
        self.links: list[list[LinkSample]] = []
        self.late: list[float] = []  # on_late: seconds without a snapshot, once per late snapshot

        def on_snapshot(s: Snapshot) -> None:
            self.snaps.append(s)
            self.store.apply(s)

        def on_stale(reason: str) -> None:
            self.stale.append(reason)
            self.store.mark_stale()

        self.sup = NvmlSupervisor(
            nvml, ProcessesConfig(top_n=top_n), SysfsConfig(root=sysfs_root), clock=clock or RealClock(),
            on_snapshot=on_snapshot, on_stale=on_stale, on_links=self.links.append, on_late=self.on_late,
            env={**os.environ, STATE_ENV: str(state)}, worker_module=SIM_WORKER_MODULE,
            **({"python": python} if python else {}),
        )
        self.task: asyncio.Task[None] | None = None

    def on_late(self, silent: float) -> None:
        self.late.append(silent)
        self.store.mark_stale()

    async def __aenter__(self) -> Harness:
        self.task = asyncio.create_task(self.sup.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.sup.stop()
        assert self.task is not None
        await asyncio.wait_for(self.task, WAIT)

    async def until(self, pred: Callable[[], bool], what: str, wait: float = WAIT) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        while not pred():
            assert self.task is not None and not self.task.done(), f"supervisor ended while waiting for {what}"
            assert loop.time() < end, f"gave up waiting for {what}"
            await asyncio.sleep(0.01)

    async def next_snapshot(self, pred: Callable[[Snapshot], bool] = lambda s: True, what: str = "") -> Snapshot:
        start = len(self.snaps)
        await self.until(lambda: any(pred(s) for s in self.snaps[start:]), what or "a snapshot")
        return next(s for s in self.snaps[start:] if pred(s))


async def test_snapshots_stamped_with_daemon_clock(standin_libdir: Path, write_sim_state: StateWriter,
                                                   tmp_path: Path) -> None:
    clock = ManualClock(start=1_000.0)
    async with Harness(fast_nvml(standin_libdir), write_sim_state(make_state(2)), tmp_path, clock=clock) as h:
        first = await h.next_snapshot()
        clock.advance(7.0)
        later = await h.next_snapshot(lambda s: s.timestamp == 1_007.0, "a snapshot after the clock moved")
    assert first.timestamp == 1_000.0 and first.nvml_ok and len(first.gpus) == 2
    assert later.gpus[0].uuid == first.gpus[0].uuid
    assert h.sup.restarts == 0 and h.sup.last_error is None and h.stale == []


async def test_no_library_then_installed_without_restart(standin_libdir: Path, write_sim_state: StateWriter,
                                                         tmp_path: Path) -> None:
    libdir = tmp_path / "driver"
    libdir.mkdir()
    async with Harness(fast_nvml(libdir), write_sim_state(make_state(1)), tmp_path) as h:
        down = await h.next_snapshot()
        assert (down.nvml_ok, down.nvml_error) == (False, "library_not_found")
        await h.until(lambda: h.sup.init_failures >= 2 and h.sup.restarts == 0, "init retries")
        assert h.sup.last_error == "library_not_found"
        assert h.store.latest is not None and h.store.latest.nvml_error == "library_not_found"
        (libdir / "libnvidia-ml.so.1").symlink_to(standin_libdir / "libnvidia-ml.so.1")  # driver installed
        up = await h.next_snapshot(lambda s: s.nvml_ok, "NVML up after install")
    assert len(up.gpus) == 1 and h.sup.last_error is None


async def test_driver_not_loaded_then_loaded(standin_libdir: Path, write_sim_state: StateWriter,
                                             tmp_path: Path) -> None:
    path = write_sim_state(make_state(1, init_error="DRIVER_NOT_LOADED"))
    async with Harness(fast_nvml(standin_libdir), path, tmp_path) as h:
        down = await h.next_snapshot()
        assert (down.nvml_ok, down.nvml_error, h.sup.last_error) == (False, "driver_not_loaded", "driver_not_loaded")
        write_sim_state(make_state(1))  # modprobe nvidia
        await h.next_snapshot(lambda s: s.nvml_ok, "NVML up after the driver loaded")
    assert h.sup.init_failures >= 1 and h.sup.restarts == 0 and h.stale == []


def _children() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


async def test_nvml_hang_scenario(standin_libdir: Path, write_sim_state: StateWriter, tmp_path: Path) -> None:
    scenario = load_scenario("nvml-hang")
    path = write_sim_state(state_at(scenario, 0))
    nvml = fast_nvml(standin_libdir, poll_timeout=1.0)
    async with Harness(nvml, path, tmp_path) as h:
        healthy = await h.next_snapshot()
        hung_uuid = healthy.gpus[1].uuid
        write_sim_state(state_at(scenario, 6))  # GPU 1's calls now block for 60 s
        # the worker sets GPU 1 aside on its own: suspected first (a guess: kept present, last readings held) ...
        s = await h.next_snapshot(lambda s: bool(s.lost), "GPU 1 set aside")
        assert [g.index for g in s.gpus] == [0]
        assert [(x.index, x.uuid, x.reason) for x in s.lost] == [(1, hung_uuid, "hang_suspected")]
        assert h.store.presence[hung_uuid].state == "present"
        assert [g.index for g in h.store.latest.gpus] == [0, 1]  # type: ignore[union-attr]
        # ... then hung, once the call has blocked for poll_timeout while GPU 0 answered
        s = await h.next_snapshot(lambda s: any(x.reason == "timeout" for x in s.lost), "GPU 1 hung")
        assert [(x.index, x.uuid, x.reason) for x in s.lost] == [(1, hung_uuid, "timeout")]
        assert h.store.presence[hung_uuid].state == "lost"
        start = len(h.snaps)
        await h.until(lambda: len(h.snaps) >= start + 20, "GPU 0 reporting on through the hang")
        assert all([g.index for g in x.gpus] == [0] for x in h.snaps[start:])
        write_sim_state(state_at(scenario, 66))  # the driver answers again
        back = await h.next_snapshot(lambda s: s.nvml_ok and len(s.gpus) == 2, "data after the hang")
    assert back.gpus[1].temperature_celsius == 49 and back.lost == ()
    assert h.store.presence[hung_uuid].state == "present" and not h.store.stale
    # no worker was killed or replaced, no retry: the blocked call itself returned
    assert h.sup.spawned == 1 and h.sup.restarts == 0 and h.stale == []
    assert _children() == []


async def test_healthy_gpus_never_wait_for_a_hung_one(standin_libdir: Path, write_sim_state: StateWriter,
                                                     tmp_path: Path) -> None:
    """Through a whole hang, the healthy GPUs' readings arrive every poll: no freeze at the start, none later."""
    state = make_state(4)
    path = write_sim_state(state)
    nvml = fast_nvml(standin_libdir, poll_interval=0.1, poll_timeout=1.0)
    async with Harness(nvml, path, tmp_path) as h:
        await h.next_snapshot()
        state["devices"][2]["delays_ms"] = {"*": -1}
        write_sim_state(state)
        start = len(h.snaps)
        await h.until(lambda: len(h.snaps) >= start + 40, "40 polls during the hang")
        during = h.snaps[start:]
        state["devices"][2]["delays_ms"] = {}
        write_sim_state(state)
        await h.next_snapshot(lambda s: len(s.gpus) == 4, "GPU 2 back")
    # every snapshot carries GPUs 0, 1 and 3; GPU 2 is in one (the one it blocked in returned once un-hung) or none
    assert all({0, 1, 3} <= {g.index for g in s.gpus} for s in during)
    assert sum(2 not in {g.index for g in s.gpus} for s in during) >= 35
    assert h.stale == [] and h.sup.spawned == 1  # never a worker killed or replaced


async def test_egpu_unplug_scenario(standin_libdir: Path, write_sim_state: StateWriter, tmp_path: Path) -> None:
    scenario = load_scenario("egpu-unplug")
    egpu, internal = "GPU-3a1e07c5-9c0f-4b7e-8d1a-e6b3090e6b30", "GPU-7d52c1a0-41a2-4c35-9a4f-0a2000a20000"
    plug(tmp_path, "0000:06:00.0")
    plug(tmp_path, "0000:41:00.0")
    path = write_sim_state(state_at(scenario, 0))
    async with Harness(fast_nvml(standin_libdir), path, tmp_path) as h:
        s = await h.next_snapshot()
        assert [g.uuid for g in s.gpus] == [egpu, internal]
        assert s.gpus[0].processes[0].name == "python3"
        write_sim_state(state_at(scenario, 61))  # cable pulled: GPU_IS_LOST on every call
        await h.until(lambda: h.store.presence[egpu].state == "lost", "the eGPU marked lost")
        await h.until(lambda: h.sup.restarts >= 1, "a fresh worker after the loss")
        write_sim_state(state_at(scenario, 76))  # the kernel removed it
        unplug(tmp_path, "0000:06:00.0")
        await h.until(lambda: h.store.presence[egpu].state == "removed", "the eGPU marked removed")
        s = await h.next_snapshot()
        assert [(g.index, g.uuid) for g in s.gpus] == [(0, internal)]
        write_sim_state(state_at(scenario, 121))  # plugged back in, on a new bus, enumerating second
        plug(tmp_path, "0000:71:00.0")
        await h.until(lambda: h.store.presence[egpu].state == "present", "the eGPU present again")
        s = await h.next_snapshot()
    assert [(g.index, g.uuid, g.pci_bus_id) for g in s.gpus] == [(0, internal, "00000000:41:00.0"),
                                                                  (1, egpu, "00000000:71:00.0")]
    assert h.store.presence[internal].state == "present"
    assert h.stale == []  # a loss is not a hang: data never went stale
    assert any(link.pci_bus_id == "0000:41:00.0" and link.current_width == 4 for ls in h.links for link in ls)


async def test_links_are_read_on_the_beat_of_each_line(standin_libdir: Path, write_sim_state: StateWriter,
                                                      tmp_path: Path) -> None:
    """The hot-plug scan and the links ride on the worker's lines (runtime/beat.py): each line fires the beat,
    and a scan follows it in that wake-up. With a two-minute poll interval, the first line (at the worker's start)
    is the only thing that can bring a scan within the test: the scan's own timer is 132 s away."""
    st = make_state(1)
    plug(tmp_path, "0000:0c:00.0")
    async with Harness(fast_nvml(standin_libdir, poll_interval=120.0), write_sim_state(st), tmp_path) as h:
        await h.next_snapshot()
        await h.until(lambda: bool(h.links), "the links read after the first line")
        fired = h.sup.beat.fired
    assert fired >= 1 and len(h.snaps) >= 1
    assert [(link.pci_bus_id, link.current_width) for link in h.links[0]] == [("0000:0c:00.0", 4)]


async def test_hot_plug_is_seen_on_the_scan_timer_while_no_line_comes(
        standin_libdir: Path, write_sim_state: StateWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The sysfs watch rides on the worker's lines, but needs none: with the worker stopped (SIGSTOP, so no line
    comes and its 60 s deadline is far off) a GPU unplugged from sysfs still asks for a fresh worker, on the scan's
    own timer (the period, 0.5 s, x 1.1)."""
    plug(tmp_path, "0000:0c:00.0")
    plug(tmp_path, "0000:0d:00.0")
    nvml = fast_nvml(standin_libdir, poll_interval=0.5, poll_timeout=60.0)
    caplog.set_level("INFO", logger="gpuwatchd.sources.nvml.supervisor")
    async with Harness(nvml, write_sim_state(make_state(2)), tmp_path) as h:
        await h.next_snapshot(lambda s: len(s.gpus) == 2, "2 GPUs")
        proc = h.sup._proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)
        fired = h.sup.beat.fired
        # Two link readings more: the first may be the scan the last line's beat woke, the second ran on the timer.
        n = len(h.links)
        await h.until(lambda: len(h.links) >= n + 2, "the scan running on its own timer")
        unplug(tmp_path, "0000:0d:00.0")
        await h.until(lambda: "pci_devices_changed" in caplog.text, "the unplug seen by the sysfs watch")
        assert h.sup.beat.fired == fired  # no line came: the scan ran on its own timer
        # The restart's SIGTERM waits, as any signal does, for the stopped worker to run: let it.
        os.kill(proc.pid, signal.SIGCONT)
        await h.until(lambda: h.sup.spawned >= 2, "a fresh worker")
    assert "removed=['0000:0d:00.0']" in caplog.text
    assert h.stale == []  # replaced for the hot-plug, not as a hung worker


async def test_device_count_change_seen_by_fresh_worker(standin_libdir: Path, write_sim_state: StateWriter,
                                                        tmp_path: Path) -> None:
    plug(tmp_path, "0000:0c:00.0")
    async with Harness(fast_nvml(standin_libdir), write_sim_state(make_state(1)), tmp_path) as h:
        assert len((await h.next_snapshot()).gpus) == 1
        write_sim_state(make_state(2))  # hot-added: a live NVML session does not see it...
        s = await h.next_snapshot()
        assert s.device_count == 1 and h.sup.restarts == 0
        plug(tmp_path, "0000:0d:00.0")  # ...the PCI function appearing in sysfs triggers re-enumeration
        s = await h.next_snapshot(lambda s: s.device_count == 2, "the new GPU")
    assert [g.index for g in s.gpus] == [0, 1] and h.sup.restarts == 1 and h.stale == []


async def test_reconfigure_applies_new_top_n(standin_libdir: Path, write_sim_state: StateWriter,
                                             tmp_path: Path) -> None:
    procs = [{"pid": 10 + i, "used_memory": 1000 + i} for i in range(6)]
    state = make_state(1, devices=[make_device(0, processes={"compute": procs, "graphics": []})])
    nvml = fast_nvml(standin_libdir)
    async with Harness(nvml, write_sim_state(state), tmp_path, top_n=2) as h:
        assert len((await h.next_snapshot()).gpus[0].processes) == 2
        h.sup.reconfigure(nvml, ProcessesConfig(top_n=4), SysfsConfig(root=tmp_path))
        s = await h.next_snapshot(lambda s: len(s.gpus[0].processes) == 4, "top 4 after reload")
    assert s.gpus[0].processes_total == 6 and h.sup.restarts == 1 and h.stale == []


async def test_worker_crash_is_stale_and_respawned(standin_libdir: Path, write_sim_state: StateWriter,
                                                   tmp_path: Path) -> None:
    async with Harness(fast_nvml(standin_libdir), write_sim_state(make_state(1)), tmp_path) as h:
        await h.next_snapshot()
        proc = h.sup._proc
        assert proc is not None
        os.kill(proc.pid, 9)  # e.g. a segfault inside the driver
        await h.until(lambda: bool(h.stale), "the crash noticed")
        assert h.stale[0] == "NVML worker exited unexpectedly (worker_signal_9)"
        assert h.sup.last_error == "worker_signal_9"
        await h.next_snapshot(lambda s: s.nvml_ok, "a respawned worker's snapshot")
    assert h.sup.restarts == 1


@pytest.mark.timeout(200)
async def test_60_stopped_worker_kill_cycles_do_not_leak(standin_libdir: Path, write_sim_state: StateWriter,
                                                         tmp_path: Path) -> None:
    path = write_sim_state(make_state(1))
    me = psutil.Process()

    def footprint() -> tuple[int, int, int, int]:
        return (len(os.listdir("/proc/self/fd")), len(me.children(recursive=True)), __import__("threading")
                .active_count(), me.memory_info().rss)

    nvml = fast_nvml(standin_libdir, poll_timeout=0.1, kill_grace=0.05, restart_backoff_initial=0.01,
                     restart_backoff_max=0.01)
    async with Harness(nvml, path, tmp_path) as h:

        async def cycles(n: int) -> None:
            for _ in range(n):
                start = len(h.snaps)
                await h.until(lambda n=start: len(h.snaps) > n and h.sup._proc is not None, "a working worker")
                proc = h.sup._proc
                assert proc is not None
                stale = len(h.stale)
                os.kill(proc.pid, signal.SIGSTOP)  # a worker stopped as a whole: killed and replaced
                await h.until(lambda n=stale: len(h.stale) > n, "the stopped worker replaced")

        await cycles(10)  # warm-up: first-use allocations, caches, the child watcher
        before = footprint()
        await cycles(60)
        after = footprint()
    stopped = "the NVML worker is stopped (SIGSTOP or a debugger): no snapshot for more than 0.1s; replaced"
    # On a loaded machine a fresh, running worker can also miss the 0.1 s deadline between two stops: that is the
    # plain timeout, replaced the same way (more kill cycles, which is what this test is about).
    slow = "timeout: no snapshot from the NVML worker within its deadline (outside GPU calls)"
    assert len(h.stale) >= 70 and set(h.stale) <= {stopped, slow}, set(h.stale)
    assert h.stale.count(stopped) >= 60, h.stale
    assert all(not s.lost for s in h.snaps)  # a stopped worker blames no GPU
    fds, children, threads, rss = before
    assert after[0] <= fds, f"fds {fds} -> {after[0]}"
    assert after[1] <= children + 1
    assert after[2] <= threads, f"threads {threads} -> {after[2]}"
    assert after[3] - rss < 4 * 1024 * 1024, f"rss grew {(after[3] - rss) / 1e6:.1f} MB"


async def test_stopped_worker_blames_no_gpu(standin_libdir: Path, write_sim_state: StateWriter,
                                            tmp_path: Path) -> None:
    """SIGSTOP of the whole worker during GPU calls (16 GPUs, 100 ms polls): late data, no GPU set aside."""
    state = make_state(16)
    for dev in state["devices"]:
        dev["delays_ms"] = {"nvmlDeviceGetPowerUsage": 4}  # most of a poll is spent inside GPU calls
    path = write_sim_state(state)
    nvml = fast_nvml(standin_libdir, poll_interval=0.1, poll_timeout=3.0)
    async with Harness(nvml, path, tmp_path) as h:
        await h.next_snapshot(lambda s: len(s.gpus) == 16, "16 GPUs")
        proc = h.sup._proc
        assert proc is not None
        for _ in range(3):
            os.kill(proc.pid, signal.SIGSTOP)  # stopped for longer than the 0.25 s stall watch, less than 3 s
            late = len(h.late)
            await h.until(lambda n=late: len(h.late) > n, "the late poll noticed")
            assert h.store.stale  # gpuwatchd_nvml_stale 1 as soon as a poll is late
            await asyncio.sleep(1.0)
            os.kill(proc.pid, signal.SIGCONT)
            start = len(h.snaps)
            await h.until(lambda n=start: len(h.snaps) >= n + 5, "polls after SIGCONT")
            assert not h.store.stale
        os.kill(proc.pid, signal.SIGSTOP)  # and this time for good: the worker is replaced
        await h.until(lambda: bool(h.stale), "the stopped worker replaced")
        await h.next_snapshot(lambda s: len(s.gpus) == 16, "the new worker's snapshot")
    assert h.stale == ["the NVML worker is stopped (SIGSTOP or a debugger): no snapshot for more than 3.0s; "
                       "replaced"]
    assert h.sup.last_error is None and h.sup.spawned == 2
    assert all(not s.lost for s in h.snaps)  # never a GPU set aside, suspected or lost
    assert all(p.state == "present" for p in h.store.presence.values())


async def test_sim_speed_does_not_shrink_the_hang_deadline(standin_libdir: Path, write_sim_state: StateWriter,
                                                           tmp_path: Path) -> None:
    """At --speed 60, poll_timeout 5 s is 83 ms of real time: a merely slow call must not count as a hang."""
    state = make_state(2)
    state["devices"][1]["delays_ms"] = {"nvmlDeviceGetPowerUsage": 150}  # slow, and under load slower
    path = write_sim_state(state)
    nvml = fast_nvml(standin_libdir, poll_interval=1.0, poll_timeout=5.0)
    clock = ScaledClock(speed=60.0)
    async with Harness(nvml, path, tmp_path, clock=clock) as h:
        assert h.sup._hang_after() == 5.0  # the floor: min(poll_timeout, 5 s) of real time
        await h.until(lambda: len(h.snaps) >= 30, "30 polls")
    assert all(x.reason != "timeout" for s in h.snaps for x in s.lost)
    assert all(p.state == "present" for p in h.store.presence.values()) and h.stale == []


async def test_init_retry_backoff_is_capped_and_reset(standin_libdir: Path, write_sim_state: StateWriter,
                                                      tmp_path: Path) -> None:
    nvml = fast_nvml(standin_libdir, restart_backoff_initial=0.01, restart_backoff_max=0.04)
    path = write_sim_state(make_state(1, init_error="DRIVER_NOT_LOADED"))
    async with Harness(nvml, path, tmp_path) as h:
        await h.until(lambda: h.sup.init_failures >= 4, "init retries")
        assert h.sup.backoff == 0.04  # 0.01 -> 0.02 -> 0.04, then capped
        write_sim_state(make_state(1))
        start = len(h.snaps)
        await h.until(lambda: sum(s.nvml_ok for s in h.snaps[start:]) >= 3, "a healthy worker")
        h.sup.request_restart("test")  # ends the healthy worker; its healthy run resets the backoff
        await h.until(lambda: h.sup.backoff == 0.01, "backoff reset after a healthy run")
    assert h.stale == []


async def test_unstartable_worker_is_reported_and_retried(tmp_path: Path) -> None:
    async with Harness(fast_nvml(None), tmp_path / "state", tmp_path, python=str(tmp_path / "no-python")) as h:
        await h.until(lambda: len(h.stale) >= 2, "two failed starts")
    assert h.stale[0].startswith("cannot start the NVML worker: No such file or directory")
    assert h.sup.last_error == "spawn_failed" and h.snaps == []


async def test_out_of_file_descriptors_is_a_failed_start_not_the_end(
    standin_libdir: Path, write_sim_state: StateWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE while preparing a worker (e.g. an HTTP connection flood) is retried with backoff, never fatal."""
    real = os.memfd_create
    refusals = [3]

    def memfd_create(name: str, flags: int = os.MFD_CLOEXEC) -> int:
        if refusals[0] > 0:
            refusals[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real(name, flags)

    monkeypatch.setattr("gpuwatchd.sources.nvml.supervisor.os.memfd_create", memfd_create)
    path = write_sim_state(make_state(1))
    async with Harness(fast_nvml(standin_libdir), path, tmp_path) as h:
        await h.until(lambda: any(s.nvml_ok for s in h.snaps), "a worker once descriptors are back")
    assert h.stale[0] == "cannot start the NVML worker: Too many open files"
    assert refusals == [0]


async def test_garbage_from_the_worker_replaces_it(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho '{\"hello\": 1}'\necho 'Segmentation fault? {'\nexec sleep 30\n")
    fake.chmod(0o755)
    async with Harness(fast_nvml(None), tmp_path / "state", tmp_path, python=str(fake)) as h:
        await h.until(lambda: len(h.stale) >= 2, "two replaced workers")
    assert h.stale[0].startswith("unreadable line from the NVML worker")
    assert h.sup.last_error == "protocol_error" and h.snaps == []
    assert _children() == []  # the sleeping fakes were killed with their process group
