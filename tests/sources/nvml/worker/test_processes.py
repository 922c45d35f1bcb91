"""Process merge / top-N / host enrichment, with real host processes for the psutil resolver."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from gpuwatchd.sources.nvml.worker.processes import (
    HOST_PID_NAMESPACE,
    UNKNOWN,
    PsutilResolver,
    in_host_pid_namespace,
    merge_processes,
    pid_max,
    process_dicts,
    process_dicts_per_gpu,
    top_processes,
)


def test_merge_counts_a_compute_and_graphics_process_once() -> None:
    # C+G: both NVML lists carry the process's whole memory (nvml.h), so the larger value wins, never the sum
    merged = merge_processes([(10, 100), (11, 50), (14, 3)], [(10, 107), (11, 40), (12, None), (13, 5), (14, None)])
    assert merged == {10: ["compute", 107], 11: ["compute", 50], 12: ["graphics", None], 13: ["graphics", 5],
                      14: ["compute", 3]}


def test_merge_c_plus_g_with_memory_only_in_the_graphics_list() -> None:
    assert merge_processes([(20, None)], [(20, 4096)]) == {20: ["compute", 4096]}


def test_merge_drops_invalid_pids() -> None:
    # 0, negative and beyond pid_max come from a struct-layout mismatch (nvitop#75), not from processes
    merged = merge_processes([(0, 1), (-3, 1), (5_000_000, 1), (42, 1)], [], limit=4_194_304)
    assert list(merged) == [42]


def test_merge_wddm_null_memory_stays_unattributed() -> None:
    merged = merge_processes([], [(7, None), (7, None)])
    assert merged == {7: ["graphics", None]}


def test_top_n_orders_by_memory_unattributed_last() -> None:
    merged = merge_processes([(1, 10), (2, 30), (3, None), (4, 20), (5, 30)], [])
    assert top_processes(merged, 3) == [(2, "compute", 30), (5, "compute", 30), (4, "compute", 20)]
    assert [t[0] for t in top_processes(merged, 10)] == [2, 5, 4, 1, 3]
    assert top_processes(merged, 0) == []


def test_top_n_partial_sort_agrees_with_a_full_sort() -> None:
    mems: list[int | None] = [None, 5, 5, 1 << 40, 0, None, 3, 7, 7, 2]
    merged = merge_processes([(100 + i, m) for i, m in enumerate(mems)], [(300, 6), (301, None)])
    full = sorted(((p, e[0], e[1]) for p, e in merged.items()), key=lambda t: (t[2] is None, -(t[2] or 0), t[0]))
    for n in range(len(full) + 2):
        assert top_processes(merged, n) == full[:n]
    assert top_processes(merged, -1) == []


def test_one_resolve_per_poll_keeps_every_gpus_cache() -> None:
    calls: list[list[int]] = []

    class Recording:
        def resolve(self, pids: list[int]) -> dict[int, tuple[str | None, str | None, int | None]]:
            calls.append(list(pids))
            return {p: (f"p{p}", None, None) for p in pids}

    tops = [[(1, "compute", 10), (2, "compute", 5)], [], [(3, "graphics", None)]]
    out = process_dicts_per_gpu(tops, Recording())
    assert calls == [[1, 2, 3]]
    assert [[d["name"] for d in gpu] for gpu in out] == [["p1", "p2"], [], ["p3"]]
    assert out[2][0] == {"pid": 3, "kind": "graphics", "used_memory_bytes": None, "name": "p3", "user": None,
                         "host_rss_bytes": None, "host_state": None, "host_state_seconds": None}
    assert process_dicts_per_gpu([[], []], Recording()) == [[], []] and len(calls) == 1  # nothing to resolve
    # PsutilResolver bounds its cache by the pids of its last call: with one call per poll, two GPUs' processes
    # both stay cached, so the next poll does not look every process up again
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        resolver = PsutilResolver()
        gpus = [[(child.pid, "compute", 1)], [(os.getpid(), "compute", 1)]]
        first = process_dicts_per_gpu(gpus, resolver)
        cached = dict(resolver._cache)
        assert set(cached) == {child.pid, os.getpid()}
        again = process_dicts_per_gpu(gpus, resolver)
        assert all(resolver._cache[p][0] is cached[p][0] for p in cached)  # same psutil.Process objects reused
        assert [[d["name"] for d in g] for g in again] == [[d["name"] for d in g] for g in first]
    finally:
        child.kill()
        child.wait()


def test_pid_max_reads_proc(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel").mkdir(parents=True)
    (tmp_path / "sys/kernel/pid_max").write_text("32768\n")
    assert pid_max(tmp_path) == 32768
    assert pid_max(tmp_path / "missing") == 4_194_304


def test_psutil_resolver_real_process_and_gone_pid() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        resolver = PsutilResolver()
        infos = resolver.resolve([child.pid, os.getpid()])
        name, user, rss = infos[child.pid]
        assert name == psutil.Process(child.pid).name()
        assert user == getpass.getuser()
        assert rss is not None and rss > 0
        own_rss = infos[os.getpid()][2]
        assert own_rss is not None and own_rss > 10_000_000  # this pytest process: tens of MB
        # cached entry is reused while the process lives, and dropped when it is gone
        assert resolver.resolve([child.pid])[child.pid][0] == name
    finally:
        child.kill()
        child.wait()
    assert resolver.resolve([child.pid]) == {child.pid: UNKNOWN}


def test_psutil_resolver_negative_cache_rechecks_a_missing_pid_later() -> None:
    # a pid NVML reports that is not a process here (another pid namespace, the stand-in's fictitious pids) is
    # looked up once, then only after the recheck period; a pid no longer reported leaves the negative cache
    limit = pid_max()
    missing = next(p for p in range(limit - 1, 1, -1) if not psutil.pid_exists(p))
    now = [100.0]
    resolver = PsutilResolver(recheck=60.0, clock=lambda: now[0])
    assert resolver.resolve([missing, os.getpid()])[missing] == UNKNOWN
    assert resolver.lookups == 2
    for _ in range(5):
        now[0] += 10.0
        assert resolver.resolve([missing, os.getpid()])[missing] == UNKNOWN
    assert resolver.lookups == 2  # 50 s later: neither looked up again (own pid from the positive cache)
    now[0] += 11.0
    assert resolver.resolve([missing, os.getpid()])[missing] == UNKNOWN
    assert resolver.lookups == 3  # past the recheck period: looked up again, still missing
    resolver.resolve([os.getpid()])
    assert resolver.resolve([missing])[missing] == UNKNOWN
    assert resolver.lookups == 4  # dropped while not reported: a pid reported again is looked up at once
    # a process that exists is found even if its pid was once missing
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        resolver._missing[child.pid] = now[0] - 1.0  # its recheck time has come
        assert resolver.resolve([child.pid])[child.pid][0] == psutil.Process(child.pid).name()
        assert child.pid not in resolver._missing
    finally:
        child.kill()
        child.wait()


def test_process_dicts_is_the_pipe_encoding() -> None:
    class Fixed:
        def resolve(self, pids: list[int]) -> dict[int, tuple[str | None, str | None, int | None]]:
            return {p: ("python", "alice", 2048) for p in pids if p == 1}

    out = process_dicts([(1, "compute", 100), (2, "graphics", None)], Fixed())
    assert out == [
        {"pid": 1, "kind": "compute", "used_memory_bytes": 100, "name": "python", "user": "alice",
         "host_rss_bytes": 2048, "host_state": None, "host_state_seconds": None},
        {"pid": 2, "kind": "graphics", "used_memory_bytes": None, "name": None, "user": None, "host_rss_bytes": None,
         "host_state": None, "host_state_seconds": None},
    ]


def _unused_pid() -> int:
    return next(p for p in range(pid_max() - 1, 1, -1) if not psutil.pid_exists(p))


def test_host_pid_namespace_is_read_from_proc_self(tmp_path: Path) -> None:
    # The host's pid namespace has a fixed inode (PROC_PID_INIT_INO); any other namespace, or none readable, is not.
    (tmp_path / "host/self/ns").mkdir(parents=True)
    (tmp_path / "host/self/ns/pid").symlink_to(HOST_PID_NAMESPACE)
    (tmp_path / "container/self/ns").mkdir(parents=True)
    (tmp_path / "container/self/ns/pid").symlink_to("pid:[4026532198]")
    assert in_host_pid_namespace(tmp_path / "host")
    assert not in_host_pid_namespace(tmp_path / "container")
    assert not in_host_pid_namespace(tmp_path / "nothing")
    assert in_host_pid_namespace() == (os.readlink("/proc/self/ns/pid") == HOST_PID_NAMESPACE)


def test_states_of_real_processes_live_zombie_and_gone() -> None:
    now = [0.0]
    resolver = PsutilResolver(clock=lambda: now[0], host_namespace=True)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        resolver.resolve([child.pid])
        assert resolver.states([child.pid]) == {child.pid: ("live", None)}
        assert child.stdin is not None
        child.stdin.close()  # it exits; not reaped until wait(): a zombie
        for _ in range(300):
            if psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.05)
        resolver.resolve([child.pid])
        assert resolver.states([child.pid]) == {child.pid: ("zombie", 0.0)}
        now[0] += 42.0
        assert resolver.states([child.pid]) == {child.pid: ("zombie", 42.0)}
    finally:
        child.kill()
        child.wait()
    # reaped: no /proc entry; in the host's pid namespace that is gone (still counting from the first sighting)
    resolver.resolve([child.pid])
    now[0] += 8.0
    assert resolver.states([child.pid]) == {child.pid: ("gone", 50.0)}
    # a pid no longer reported forgets its age
    resolver.resolve([os.getpid()])
    assert resolver.states([os.getpid()]) == {os.getpid(): ("live", None)}
    resolver.resolve([child.pid])
    assert resolver.states([child.pid]) == {child.pid: ("gone", 0.0)}


def test_a_missing_pid_is_hidden_outside_the_host_pid_namespace() -> None:
    missing = _unused_pid()
    for host, expected in ((True, "gone"), (False, "hidden")):
        resolver = PsutilResolver(host_namespace=host)
        resolver.resolve([missing])
        assert resolver.states([missing])[missing][0] == expected
        out = process_dicts([(missing, "compute", 1 << 30)], resolver)
        assert out[0]["host_state"] == expected and out[0]["host_state_seconds"] is not None
