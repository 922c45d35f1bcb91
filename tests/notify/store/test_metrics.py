"""The state database's families: all documented in docs/metrics.md, exported through the dispatcher's collector."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from gpuwatchd.config.types import validate
from gpuwatchd.notify.store import StateStore

DOC = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"


def test_every_state_db_family_is_documented(tmp_path: Path) -> None:
    state = StateStore(tmp_path)
    try:
        families = list(state.collector().collect())
    finally:
        state.close()
    section = DOC.read_text().split("## State database", 1)[1].split("\n## ", 1)[0]
    assert len(families) == 7
    for f in families:
        name = f.name + ("_total" if f.type == "counter" else "")
        assert f"`{name}" in section, f"{name} missing from docs/metrics.md, State database"
        assert f"({f.type}" in section


async def test_exported_through_the_dispatcher(tmp_path: Path) -> None:
    from gpuwatchd.notify.config import NotifyConfig
    from gpuwatchd.notify.dispatcher import Dispatcher
    from gpuwatchd.runtime.clock import ManualClock

    d = Dispatcher(validate(NotifyConfig, {}), state_dir=tmp_path, clock=ManualClock(0.0), host="h")
    try:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(d.collector())
        text = generate_latest(reg).decode()
    finally:
        d.state.close()
    assert "gpuwatchd_state_db_writable 1.0" in text
    assert "gpuwatchd_state_db_unpersisted_notifications 0.0" in text
    assert 'gpuwatchd_state_db_write_failures_total{op="enqueue"} 0.0' in text
