"""`gpuwatchd sim --from-csv` on the real per-second captures (csv02, csv04): the daemon's per-second memory
series is the file's, and nothing fires. Aligned through /api/v1/status's scenario clock."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support import DaemonProcess, wait_until
from test_sim_cli import interrupt, sim, start_sim

from gpuwatchd.sim.csv_replay import parse_csv
from gpuwatchd.sim.player import state_at

__all__ = ["sim"]  # the fixture, used by name

CAPTURES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "captures"
CSV02 = CAPTURES / "csv02_rtx-a5000_job-start-stop_1s.csv"
CSV04 = CAPTURES / "csv04_rtx-4090_sustained-load_first2300lines.csv"
MIB = 1024 * 1024


def file_series(path: Path) -> list[int]:
    """The file's memory.used per second from its first timestamp (the last reading at or before it), bytes."""
    log = parse_csv(path.read_text())
    rows = sorted(log.gpus["0"].rows, key=lambda r: r[0])
    out, i, last = [], 0, None
    for k in range(math.floor(log.end - log.start) + 1):
        while i < len(rows) and rows[i][0] <= log.start + k + 1e-6:
            last = rows[i][1].get("memory.used", last)
            i += 1
        out.append(round((last if last is not None else rows[0][1]["memory.used"]) * MIB))
    return out


def replay(d: DaemonProcess, seconds: int) -> tuple[dict[int, int], list[str]]:
    """Poll /api/v1/status until the scenario clock passes ``seconds``: {second: memory used} from the daemon's
    latest poll at each second, and every alert state seen."""
    seen: dict[int, int] = {}
    alerts: list[str] = []

    def done() -> bool:
        status, body = d.get("/api/v1/status")
        assert status == 200
        st = json.loads(body)
        ts, scen = st["nvml"]["last_poll_timestamp"], st["scenario"]
        gpus = st["gpus"]
        if ts is not None and scen["start"] is not None and gpus and gpus[0]["readings"]:
            seen.setdefault(math.floor(ts - scen["start"]), gpus[0]["readings"]["memory_used_bytes"])
        if st["daemon"]["alerts_firing"]:
            alerts.append(f"{st['daemon']['alerts_firing']} firing at {scen['time']:.0f}s")
        return bool(scen["time"] > seconds)

    # A fixed, generous wall-clock bound (every replay here is 1-2 min of wall time at its speed), not one scaled
    # from scenario seconds.
    wait_until(done, f"the replay to pass {seconds} s", timeout=300)
    _, body = d.get("/api/v1/alerts")
    # Whole labels and annotations: a false alert must say which GPU and why, on a run that cannot be repeated.
    alerts += [json.dumps({"labels": a["labels"], "annotations": a.get("annotations", {})}, sort_keys=True)
               for a in json.loads(body) if a.get("labels", {}).get("alertname")]
    return seen, alerts


def in_file_order(want: list[int], seen: dict[int, int]) -> None:
    """Every reading is a value the file has, never one from the file's future, and the readings come in the
    file's order (no value from before one already seen)."""
    j = 0
    for k in sorted(k for k in seen if 0 <= k < len(want)):
        at = next((i for i in range(j, k + 1) if want[i] == seen[k]), None)
        assert at is not None, f"second {k}: {seen[k]} bytes is not in the file between second {j} and {k}"
        j = at


# csv04 is 42 min long: at --speed 10 (the player writes every scenario second) its first 10 min are compared
# second by second here (the start, the climb to 17-18 GB and the swinging that follows); the whole file runs at
# --speed 50 below.
@pytest.mark.timeout(600)  # a hang guard above the start (START_SECONDS) and the replay wait (300 s)
@pytest.mark.parametrize(("path", "upto"), [(CSV02, None), (CSV04, 600)], ids=["csv02", "csv04"])
def test_replayed_memory_series_is_the_files_and_nothing_fires(
    sim: list[DaemonProcess], tmp_path: Path, path: Path, upto: int | None
) -> None:
    if not path.exists():
        pytest.skip(f"real capture {path.name} not available (shared captures folder {CAPTURES} absent)")
    want = file_series(path)[:upto]
    d = start_sim(sim, tmp_path, "--from-csv", str(path), "--speed", "10")
    seen, alerts = replay(d, len(want) - 1)
    # The daemon polls once per scenario second and the player writes once per scenario second (its 0.1 s wall
    # tick at --speed 10), out of phase: on a loaded machine either can fall behind by a few seconds, so the reading
    # stamped second k may be the file's value of an earlier second; what holds whatever the load is in_file_order.
    assert len(seen) >= len(want) // 2, f"only {len(seen)} of {len(want)} seconds observed"
    in_file_order(want, seen)
    assert alerts == [], d.log()[-4000:]
    assert interrupt(d) == 0


# The whole of csv04 through the real daemon in under a minute: at --speed 50 the player writes every 5 scenario
# seconds (its 0.1 s wall tick) and this test reads the status every few scenario seconds, so the series is not
# compared second by second (that is the test above, and every second of the file goes through the leak rule in
# tests/rules/test_leak_captures.py); what is checked is that every reading is the file's, in its order, and that
# nothing fires over the 42 minutes. The wall-clock bound is the replay's own length plus a generous margin.
@pytest.mark.timeout(600)  # a hang guard above the start (START_SECONDS) and the replay wait (300 s)
def test_whole_csv04_through_the_daemon_reads_the_files_values_and_nothing_fires(
    sim: list[DaemonProcess], tmp_path: Path
) -> None:
    if not CSV04.exists():
        pytest.skip(f"real capture {CSV04.name} not available (shared captures folder {CAPTURES} absent)")
    want = file_series(CSV04)
    d = start_sim(sim, tmp_path, "--from-csv", str(CSV04), "--speed", "50")
    seen, alerts = replay(d, len(want) - 1)
    assert len(seen) >= len(want) // 50, f"only {len(seen)} of {len(want)} seconds observed"
    assert max(seen) >= len(want) - 60  # the replay reached the file's end
    in_file_order(want, seen)
    assert alerts == [], d.log()[-4000:]
    assert interrupt(d) == 0


def test_replay_scenario_matches_the_file_at_every_second() -> None:
    if not CSV02.exists():
        pytest.skip(f"real capture {CSV02.name} not available")
    from gpuwatchd.sim.csv_replay import load_csv_scenario

    scen = load_csv_scenario(CSV02)
    want = file_series(CSV02)
    got = [state_at(scen, k + 0.5)["devices"][0]["memory"]["used"] for k in range(len(want))]
    assert got == want
