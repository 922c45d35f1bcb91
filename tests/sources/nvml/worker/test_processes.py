"""Process merge / top-N / host enrichment, with real host processes for the psutil resolver (and a written /proc
tree for its edge cases)."""

from __future__ import annotations

import getpass
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpuwatchd.sources.nvml.worker.processes import (
    HOST_PID_NAMESPACE,
    UNKNOWN,
    ProcResolver,
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
    # ProcResolver bounds its cache by the pids of its last call: with one call per poll, two GPUs' processes
    # both stay cached, so the next poll does not look every process up again
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        resolver = ProcResolver()
        gpus = [[(child.pid, "compute", 1)], [(os.getpid(), "compute", 1)]]
        first = process_dicts_per_gpu(gpus, resolver)
        cached = dict(resolver._cache)
        assert set(cached) == {child.pid, os.getpid()}
        again = process_dicts_per_gpu(gpus, resolver)
        assert all(resolver._cache[p] is cached[p] for p in cached)  # the same entries reused, not looked up anew
        assert resolver.lookups == 2
        assert [[d["name"] for d in g] for g in again] == [[d["name"] for d in g] for g in first]
    finally:
        child.kill()
        child.wait()


def test_pid_max_reads_proc(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel").mkdir(parents=True)
    (tmp_path / "sys/kernel/pid_max").write_text("32768\n")
    assert pid_max(tmp_path) == 32768
    assert pid_max(tmp_path / "missing") == 4_194_304


def test_proc_resolver_real_process_and_gone_pid() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        resolver = ProcResolver()
        infos = resolver.resolve([child.pid, os.getpid()])
        name, user, rss = infos[child.pid]
        assert name == Path(f"/proc/{child.pid}/comm").read_text().strip()
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


def test_proc_resolver_negative_cache_rechecks_a_missing_pid_later() -> None:
    # a pid NVML reports that is not a process here (another pid namespace, the stand-in's fictitious pids) is
    # looked up once, then only after the recheck period; a pid no longer reported leaves the negative cache
    limit = pid_max()
    missing = next(p for p in range(limit - 1, 1, -1) if not psutil.pid_exists(p))
    now = [100.0]
    resolver = ProcResolver(recheck=60.0, clock=lambda: now[0])
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
        assert resolver.resolve([child.pid])[child.pid][0] == Path(f"/proc/{child.pid}/comm").read_text().strip()
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
    resolver = ProcResolver(clock=lambda: now[0], host_namespace=True)
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
        resolver = ProcResolver(host_namespace=host)
        resolver.resolve([missing])
        assert resolver.states([missing])[missing][0] == expected
        out = process_dicts([(missing, "compute", 1 << 30)], resolver)
        assert out[0]["host_state"] == expected and out[0]["host_state_seconds"] is not None


def _statm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_proc_resolver_names_users_and_rss_of_real_processes(tmp_path: Path) -> None:
    """Name (a 15-character comm extended from argv[0]), real user and RSS of real processes: this one, a
    short-named child and one whose comm the kernel truncated."""
    long_name = tmp_path / "gpuwatchd-long-process-name"
    long_name.symlink_to(sys.executable)
    short = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    long = subprocess.Popen([str(long_name), "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        pids = [os.getpid(), short.pid, long.pid]
        for _ in range(200):  # the children's comm is their executable's once they have exec'd
            comms = [Path(f"/proc/{p}/comm").read_text().strip() for p in (short.pid, long.pid)]
            if comms == [os.path.basename(sys.executable)[:15], long_name.name[:15]]:
                break
            time.sleep(0.05)
        got = ProcResolver().resolve(pids)
        me = pwd.getpwuid(os.getuid()).pw_name
        for pid in pids:
            _, user, rss = got[pid]
            assert user == me
            assert rss is not None and abs(rss - _statm_rss(pid)) < 8 << 20  # read moments apart
        assert got[short.pid][0] == os.path.basename(sys.executable)[:15]
        assert got[long.pid][0] == "gpuwatchd-long-process-name"  # comm alone: "gpuwatchd-long-"
        assert got[os.getpid()][0].startswith(Path("/proc/self/comm").read_text().strip())
    finally:
        for child in (short, long):
            child.kill()
            child.communicate()  # reaps it and closes its stdin pipe


def _fake_proc(root: Path, pid: int, comm: str, *, state: str = "S", start: int = 1000, rss_pages: int = 3,
               uid: int = 0, cmdline: bytes = b"") -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # fields 3.. of proc(5): state, then 18 more up to starttime (22), vsize (23), rss (24)
    rest = [state] + ["0"] * 18 + [str(start), "0", str(rss_pages)] + ["0"] * 20
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    (d / "status").write_text(f"Name:\t{comm[:15]}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n")
    (d / "cmdline").write_bytes(cmdline)
    # what psutil reads for RSS: size, resident, shared, text, lib, data, dirty (pages)
    (d / "statm").write_text(f"100 {rss_pages} 0 0 0 0 0\n")


def test_proc_resolver_reads_a_proc_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Edge cases on a written /proc tree: a comm with spaces and parentheses, argv rewritten with spaces
    (setproctitle), a truncated comm argv[0] does not extend, a uid without a passwd entry, a zombie, and a pid
    reused by another process (new start time: name and user read again). psutil reads the tree through its
    process-global ``PROCFS_PATH``, put back after the test."""
    monkeypatch.setattr(psutil, "PROCFS_PATH", psutil.PROCFS_PATH)
    page = os.sysconf("SC_PAGE_SIZE")
    unknown_uid = next(u for u in range(60_000, 70_000) if not _has_passwd_entry(u))
    _fake_proc(tmp_path, 10, "my (odd) name", rss_pages=5)
    _fake_proc(tmp_path, 11, "python3-trainer", cmdline=b"/opt/bin/python3-trainer-main --epochs 3 ")
    _fake_proc(tmp_path, 12, "python3-trainer", cmdline=b"/usr/bin/other\x00x\x00")
    _fake_proc(tmp_path, 13, "job", uid=unknown_uid)
    _fake_proc(tmp_path, 14, "defunct", state="Z", rss_pages=0)
    resolver = ProcResolver(proc_root=tmp_path, host_namespace=True)
    got = resolver.resolve([10, 11, 12, 13, 14, 15])
    assert got[10] == ("my (odd) name", "root", 5 * page)
    assert got[11][0] == "python3-trainer-main"
    assert got[12][0] == "python3-trainer"
    assert got[13][1] == str(unknown_uid)  # psutil's answer for a uid the passwd database does not know
    assert got[15] == UNKNOWN
    assert resolver.states([10, 14, 15]) == {10: ("live", None), 14: ("zombie", 0.0), 15: ("gone", 0.0)}
    # pid 10 ends and a new process gets its pid: another start time, so its facts are read again
    _fake_proc(tmp_path, 10, "newcomer", start=2000, uid=unknown_uid, rss_pages=7)
    assert resolver.resolve([10])[10] == ("newcomer", str(unknown_uid), 7 * page)
    assert resolver.lookups == 6  # one first read per pid; the reused pid 10 was a cache entry, not a lookup
    assert str(tmp_path) == psutil.PROCFS_PATH


def _has_passwd_entry(uid: int) -> bool:
    import pwd

    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def test_names_with_invalid_utf8_are_text_any_encoder_takes(tmp_path: Path) -> None:
    """A real process may name itself with any bytes (prctl PR_SET_NAME, an executable's file name): invalid UTF-8
    arrives from psutil as lone surrogates (surrogateescape), which made /metrics fail to encode. Now U+FFFD, and
    a 255-byte argv[0] base name is kept to 255 characters."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    setname = ("import ctypes, sys; ctypes.CDLL(None).prctl(15, b'gpu\\xff\\xfe\\x1b[2Jx', 0, 0, 0); "
               "sys.stdin.read()")
    renamed = subprocess.Popen([sys.executable, "-c", setname], stdin=subprocess.PIPE)
    exe = os.path.join(os.fsencode(tmp_path), b"gpu\xff" + b"n" * 251)
    os.symlink(sys.executable, exe)
    long = subprocess.Popen([exe, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        for _ in range(200):  # until both have exec'd and the first has renamed itself
            if b"\xff\xfe" in Path(f"/proc/{renamed.pid}/stat").read_bytes() and \
                    b"gpu\xff" in Path(f"/proc/{long.pid}/stat").read_bytes():
                break
            time.sleep(0.05)
        got = ProcResolver().resolve([renamed.pid, long.pid])
        short_name, long_name = got[renamed.pid][0], got[long.pid][0]
        assert short_name == "gpu\ufffd\ufffd\x1b[2Jx"
        assert long_name == "gpu\ufffd" + "n" * 251
        reg = CollectorRegistry()
        g = Gauge("process_memory", "test", ["process"], registry=reg)
        g.labels(short_name).set(1)
        g.labels(long_name).set(2)
        assert "gpu\ufffd" in generate_latest(reg).decode()
    finally:
        for child in (renamed, long):
            child.kill()
            child.communicate()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("handles", [True, False], ids=["proc-dirs", "psutil"])
def test_exits_of_real_processes_with_and_without_kept_descriptors(handles: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Cached processes are read through a kept /proc/PID descriptor (proc_dirs): one that exits reads as a zombie
    through it, then, reaped, loses it and is gone; a pid no longer reported is released, and close() frees every
    descriptor. Without descriptors (budget 0: the soft limit spent) psutil's reads give the same answers."""
    from gpuwatchd.sources.nvml.worker import proc_dirs

    if not handles:
        monkeypatch.setattr(proc_dirs, "MAX_DIRS", 0)
    fds_before = _open_fds()
    resolver = ProcResolver(host_namespace=True)
    watch = resolver._handles
    assert watch is not None
    children = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
                for _ in range(2)]
    ending, staying = children
    pids = [c.pid for c in children]
    try:
        got = resolver.resolve(pids)
        assert all(got[p][2] for p in pids)  # an RSS for each
        assert len(watch) == (2 if handles else 0)
        for _ in range(3):  # while they run, each poll reads them as the same live processes
            again = resolver.resolve(pids)
            assert {p: again[p][:2] for p in pids} == {p: got[p][:2] for p in pids}  # name and user
            assert all(again[p][2] for p in pids)
            assert resolver.states(pids) == {p: ("live", None) for p in pids}
        assert ending.stdin is not None
        ending.stdin.close()  # it exits: a zombie until reaped
        for _ in range(300):
            if psutil.Process(ending.pid).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.05)
        got = resolver.resolve(pids)
        assert resolver.states(pids)[ending.pid][0] == "zombie"
        assert not got[ending.pid][2]  # a zombie holds no memory
        assert (ending.pid in watch) == handles  # read through its descriptor while not reaped
        ending.wait()
        resolver.resolve(pids)
        assert resolver.states(pids)[ending.pid][0] == "gone"
        assert ending.pid not in watch  # reaped: its descriptor failed and was released
        resolver.resolve([staying.pid])  # the other pid is no longer reported: released
        assert len(watch) == (1 if handles else 0)
    finally:
        for child in children:
            child.kill()
            child.communicate()
    resolver.close()
    assert len(watch) == 0
    assert _open_fds() == fds_before


def test_more_kept_processes_than_a_poll_reads_are_read_in_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """With more kept processes than READS_PER_POLL, each is read through its descriptor at every rounds-th resolve
    (its turn: pid % rounds), keeping its last RSS between; a process that exits is seen at its next turn."""
    from gpuwatchd.sources.nvml.worker import processes

    monkeypatch.setattr(processes, "READS_PER_POLL", 2)
    children = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline();"
                                  "b = bytearray(40 << 20); sys.stdin.read()"], stdin=subprocess.PIPE)
                for _ in range(4)]  # 4 pids, 2 reads a poll: rounds = 2
    pids = [c.pid for c in children]
    resolver = ProcResolver(host_namespace=True)
    handles = resolver._handles
    assert handles is not None
    reads: list[list[int]] = []
    rss_of = handles.rss_of

    def counting(pids_read: list[int]) -> dict[int, int]:
        reads.append(sorted(pids_read))
        return rss_of(pids_read)

    monkeypatch.setattr(handles, "rss_of", counting)
    try:
        first = resolver.resolve(pids)  # every pid is new: read through psutil, and kept
        assert len(handles) == 4 and all(first[p][2] for p in pids)
        for _ in range(4):
            resolver.resolve(pids)
        # each call read only the pids of its turn, and every pid had its turn every second call
        assert all(len(r) <= 4 and all(p % 2 == (i + 2) % 2 for p in r) for i, r in enumerate(reads))
        assert sorted(p for r in reads[-2:] for p in r) == sorted(pids)
        grower = children[0]
        assert grower.stdin is not None
        grower.stdin.write(b"grow\n")
        grower.stdin.flush()
        before = first[grower.pid][2]
        assert before is not None
        seen = []
        for _ in range(200):  # it allocates 40 MB: the new RSS shows at its turn, and stays between turns
            got = resolver.resolve(pids)[grower.pid][2]
            assert got is not None
            seen.append(got)
            if len(seen) >= 2 and seen[-1] > before + (30 << 20) and seen[-2] > before + (30 << 20):
                break
            time.sleep(0.02)
        assert seen[-1] > before + (30 << 20)
        ending = children[1]
        ending.kill()
        ending.wait()  # reaped: its descriptor fails at its next turn, and the pid is gone
        states = [resolver.resolve(pids) and resolver.states(pids)[ending.pid][0] for _ in range(2)]
        assert "gone" in states
        assert ending.pid not in handles
    finally:
        for child in children:
            child.kill()
            child.communicate()
        resolver.close()
