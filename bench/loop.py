"""Event-loop cost per poll of decoding a worker line and applying it to the Store, now vs the first-round code.

    python bench/loop.py [--quick] [--profile]

A real worker line is produced once per size by the NVML worker against the stand-in (8 GPUs x 32 processes and
16 x 256, top_n = all processes, so every process crosses the pipe). Then, in this process:
decode = ``Snapshot.from_json`` of that line; encode = ``Snapshot.to_json`` (the worker's side); apply =
``Store.apply`` of consecutive snapshots 1 s apart (default 5 s step, 1 h retention), timed after a warm-up so
every ring runs in its steady state. The "old" figures run copies of the first-round functions (kept below,
verbatim) in the same run on the same lines, so the speedups are a fair before/after. Each figure is the median
of REPEATS timings, in ms per poll. ``--profile`` prints a cProfile of decode + apply to stderr.
The last line holds the figures as name=value pairs.
"""

from __future__ import annotations

import cProfile
import dataclasses
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatchd.model import (  # noqa: E402
    GpuIdentity,
    GpuPresence,
    GpuSample,
    LostGpu,
    ProcessSample,
    Snapshot,
    XidEvent,
)
from gpuwatchd.sim.build import build_standin  # noqa: E402
from gpuwatchd.sim.state import make_state, write_state  # noqa: E402
from gpuwatchd.store import ProcessPoint, Store, _point, _Ring  # noqa: E402

SIZES = [(8, 32), (16, 256)]  # GPUs, processes per GPU
REPEATS = 5


# -- the first-round implementation, verbatim (the "before") -----------------------------------------------------


def _old_pick(cls: type[Any], data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def old_snapshot_from_dict(data: dict[str, Any]) -> Snapshot:
    gpus = []
    for raw in data.get("gpus", ()):
        g = _old_pick(GpuSample, raw)
        g["processes"] = tuple(ProcessSample(**_old_pick(ProcessSample, p)) for p in g.get("processes", ()))
        if g.get("fan_speed_ratios") is not None:
            g["fan_speed_ratios"] = tuple(g["fan_speed_ratios"])
        gpus.append(GpuSample(**g))
    d = _old_pick(Snapshot, data)
    d["gpus"] = tuple(gpus)
    d["lost"] = tuple(LostGpu(**_old_pick(LostGpu, x)) for x in data.get("lost", ()))
    d["xid_events"] = tuple(XidEvent(**_old_pick(XidEvent, x)) for x in data.get("xid_events", ()))
    return Snapshot(**d)


def old_from_json(text: str) -> Snapshot:
    return old_snapshot_from_dict(json.loads(text))


def old_to_json(snap: Snapshot) -> str:
    return json.dumps(dataclasses.asdict(snap), separators=(",", ":"))


class OldStore(Store):
    """Store with the first-round ``apply`` and ``_expire`` (readers and the rest unchanged)."""

    def apply(self, snap: Snapshot) -> None:
        self.latest = snap
        self.stale = False
        self.version += 1
        t = snap.timestamp
        seen: set[str] = set()
        for g in snap.gpus:
            seen.add(g.uuid)
            ident = GpuIdentity(g.uuid, g.index, g.name, g.pci_bus_id, g.serial)
            prev = self._presence.get(g.uuid)
            since = prev.since if prev is not None and prev.state == "present" else t
            first = prev.first_seen if prev is not None else t
            self._presence[g.uuid] = GpuPresence(ident, "present", t, since, first)
            self._gpu_hist.setdefault(g.uuid, _Ring(self.step_seconds, self.retention_seconds)).add(_point(t, g))
            for p in g.processes:
                key = (g.uuid, p.pid)
                ring = self._proc_hist.setdefault(key, _Ring(self.step_seconds, self.retention_seconds))
                ring.add(ProcessPoint(t, p.used_memory_bytes, p.host_rss_bytes))
        if snap.nvml_ok:
            for lost in snap.lost:
                if lost.uuid is None:
                    continue
                seen.add(lost.uuid)
                prev = self._presence.get(lost.uuid)
                ident = prev.identity if prev else GpuIdentity(lost.uuid, lost.index, None, lost.pci_bus_id)
                if prev is None or prev.state != "lost":
                    self._presence[lost.uuid] = GpuPresence(
                        ident, "lost", prev.last_seen if prev else t, t, prev.first_seen if prev else t
                    )
            for uuid, pres in list(self._presence.items()):
                if uuid not in seen and pres.state != "removed":
                    self._presence[uuid] = dataclasses.replace(pres, state="removed", since=t)
        for ev in snap.xid_events:
            key = (ev.uuid or "unknown", ev.xid)
            self.xid_counts[key] = self.xid_counts.get(key, 0) + 1
            self.recent_xids.append(ev)
        self._old_expire(t)

    def _old_expire(self, now: float) -> None:
        horizon = now - self.retention_seconds
        for key in [k for k, r in self._proc_hist.items() if not r.points or r.points[-1].t < horizon]:
            del self._proc_hist[key]
        for uuid in [u for u, r in self._gpu_hist.items() if not r.points or r.points[-1].t < horizon]:
            del self._gpu_hist[uuid]


# -- measurement -------------------------------------------------------------------------------------------------


def bench_state(gpus: int, procs: int) -> dict[str, Any]:
    state = make_state(gpus)
    for g, dev in enumerate(state["devices"]):
        dev["processes"] = {
            "compute": [{"pid": 10_000 + g * 1000 + i, "used_memory": (i + 1) << 20, "name": f"train{i}",
                         "user": "alice", "host_rss": 1 << 30} for i in range(procs)],
            "graphics": [],
        }
    return state


def worker_line(libdir: Path, gpus: int, procs: int) -> str:
    """One snapshot line as the real worker writes it to the daemon, against the stand-in."""
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.json"
        write_state(state, bench_state(gpus, procs))
        env = dict(os.environ, LD_LIBRARY_PATH=str(libdir), GPUWATCHD_SIM_STATE=str(state))
        opts = {"interval": 0.0, "max_polls": 1, "top_n": procs}
        r = subprocess.run([sys.executable, "-m", "gpuwatchd.sources.nvml_worker", json.dumps(opts)], env=env,
                           capture_output=True, text=True, timeout=120, check=True)
    line = r.stdout.splitlines()[1]  # after the hello line
    snap = Snapshot.from_json(line)
    assert len(snap.gpus) == gpus and all(len(g.processes) == procs for g in snap.gpus), r.stderr
    return line


def per_poll_ms(fn: Callable[[], None], n: int) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(times)


def snapshots(line: str, n: int, t0: float) -> list[Snapshot]:
    base = Snapshot.from_json(line)
    return [dataclasses.replace(base, timestamp=t0 + i) for i in range(n)]


def apply_ms(store_cls: type[Store], snaps: list[Snapshot], warm: int) -> float:
    """Apply ``warm`` polls (rings reach retention), then time the rest, REPEATS times on fresh stores."""
    times = []
    for _ in range(REPEATS):
        store = store_cls()
        for s in snaps[:warm]:
            store.apply(s)
        t0 = time.perf_counter()
        for s in snaps[warm:]:
            store.apply(s)
        times.append((time.perf_counter() - t0) / (len(snaps) - warm) * 1e3)
    return statistics.median(times)


def main() -> None:
    quick = "--quick" in sys.argv
    libdir = build_standin()
    figures: dict[str, float] = {}
    for gpus, procs in SIZES:
        line = worker_line(libdir, gpus, procs)
        snap = Snapshot.from_json(line)
        assert old_from_json(line) == snap and snap.to_json() == old_to_json(snap)  # same results, or no figure
        n = 20 if quick else 100
        tag = f"{gpus}x{procs}"
        figures[f"decode_ms_{tag}"] = per_poll_ms(lambda line=line: Snapshot.from_json(line), n)  # type: ignore[misc]
        figures[f"decode_old_ms_{tag}"] = per_poll_ms(lambda line=line: old_from_json(line), n)  # type: ignore[misc]
        figures[f"encode_ms_{tag}"] = per_poll_ms(lambda s=snap: s.to_json(), n)  # type: ignore[misc]
        figures[f"encode_old_ms_{tag}"] = per_poll_ms(lambda s=snap: old_to_json(s), n)  # type: ignore[misc]
        warm = 30  # past a few steps: every ring is in its steady state (replace the newest / append + expire)
        snaps = snapshots(line, warm + (20 if quick else 100), 1_700_000_000.0)
        figures[f"apply_ms_{tag}"] = apply_ms(Store, snaps, warm)
        figures[f"apply_old_ms_{tag}"] = apply_ms(OldStore, snaps, warm)
        for what in ("decode", "encode", "apply"):
            figures[f"{what}_speedup_{tag}"] = figures[f"{what}_old_ms_{tag}"] / figures[f"{what}_ms_{tag}"]
        if "--profile" in sys.argv:
            prof = cProfile.Profile()
            prof.enable()
            store = Store()
            for s in snaps:
                Snapshot.from_json(line)
                store.apply(s)
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(12)
        print(f"{tag}: " + " ".join(f"{k}={v:.3f}" for k, v in figures.items() if k.endswith(tag)), flush=True)
    print(" ".join(f"{k}={v:.3f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
