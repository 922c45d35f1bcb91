"""The fast encoders write exactly the bytes prometheus_client's encoders write, for both formats.

Compared on the real collectors of the daemon (store, alerts, notification metrics with their counters and
histograms) and on families built to hit every corner: escapes in HELP and label values, odd floats, timestamps,
exemplars, names outside the legacy character set, every metric type.
"""

from __future__ import annotations

import asyncio
import math
import random
import struct
from collections.abc import Callable, Iterable
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, exposition
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.openmetrics import exposition as om
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Timestamp
from prometheus_client.utils import floatToGoString

from gpuwatchd.exporter.collector import StoreCollector
from gpuwatchd.exporter.encode import (
    SLICE_SAMPLES,
    encode_yielding,
    fast_encoder,
    freeze,
    go_float,
    openmetrics_latest,
    text_latest,
)
from gpuwatchd.notify.metrics import GaugeState, NotifyMetrics
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.rules.metrics import AlertsCollector

from .conftest import BUILD, store_from_fixture

# The library's encoders and float formatter are untyped; typed names for strict mypy.
library_openmetrics: Callable[[CollectorRegistry], bytes] = om.generate_latest
library_go_float: Callable[[float], str] = floatToGoString

PROM_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


class Fixed(Collector):
    """A collector that yields the same families on every collect."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def registry(*collectors: Collector) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    for c in collectors:
        reg.register(c)
    return reg


def assert_same(reg: CollectorRegistry) -> None:
    assert openmetrics_latest(reg) == library_openmetrics(reg)
    assert text_latest(reg) == exposition.generate_latest(reg)


def daemon_registry() -> CollectorRegistry:
    """The collectors the daemon registers, over the mixed fixture store, with some notification history."""
    store = store_from_fixture("store_mixed.json")
    notify = NotifyMetrics(lambda: GaugeState(depths={"ops": 2}, silences={"active": 1}, inhibited=1))
    notify.outcome("ops", "slack", "success")
    notify.outcome("ops", "slack", "retry", "http_503")
    notify.latency.labels("ops", "slack").observe(0.2)
    engine = RulesEngine(RulesConfig(), host="node1")
    assert store.latest is not None
    engine.evaluate(store, store.latest.timestamp)
    return registry(StoreCollector(store, build=BUILD), AlertsCollector(engine), notify.collector())


def test_daemon_collectors_encode_identically() -> None:
    reg = daemon_registry()
    body = openmetrics_latest(reg).decode()
    # The page covers what it must: GPU readings, counters with _created, a histogram.
    assert 'gpuwatchd_gpu_memory_used_bytes{uuid="GPU-aaaaaaaa' in body
    assert 'gpuwatchd_alerts{alertname="GpuLost"' in body
    assert "gpuwatchd_notifications_created{" in body
    assert 'gpuwatchd_notification_latency_seconds_bucket{integration="slack",le="0.25",receiver="ops"} 1.0' in body
    assert_same(reg)


def test_escapes_in_help_and_label_values() -> None:
    g = GaugeMetricFamily("odd_gauge", 'help with \\ backslash, "quotes"\nand a newline', labels=["a", "b"])
    g.add_metric(['back\\slash "q"\nnl', "ünïcødé ✓"], 1.5)
    g.add_metric(["", "plain"], 2)
    info = InfoMetricFamily("odd", "info with a quote \"", labels=["host"])
    info.add_metric(["h1"], {"version": 'v"1\\', "empty": ""})
    assert_same(registry(Fixed([g, info])))


def test_every_metric_type_and_units() -> None:
    c = CounterMetricFamily("jobs_total", "Jobs.", labels=["kind"], unit="")
    c.add_metric(["a"], 3, created=1_700_000_000.5)
    c.add_metric(["b"], 0)
    sized = GaugeMetricFamily("disk_bytes", "Disk.", unit="bytes", value=1e12)
    h = HistogramMetricFamily("lat_seconds", "Latency.", labels=["op"], unit="seconds")
    h.add_metric(["get"], buckets=[("0.1", 1), ("1.0", 4), ("+Inf", 5)], sum_value=2.5)
    gh = GaugeHistogramMetricFamily("queue", "Queue.", buckets=[("1.0", 2), ("+Inf", 3)], gsum_value=4)
    s = SummaryMetricFamily("req", "Requests.", count_value=10, sum_value=3.25)
    ss = StateSetMetricFamily("mode", "Mode.", value={"on": True, "off": False})
    u = UnknownMetricFamily("mystery", "Unknown.", value=7)
    assert_same(registry(Fixed([c, sized, h, gh, s, ss, u])))


def test_timestamps_exemplars_and_non_legacy_names() -> None:
    t = GaugeMetricFamily("stamped", "Stamped.", labels=["x"])
    t.add_metric(["float"], 1, timestamp=1_700_000_000.25)
    t.add_metric(["ns"], 2, timestamp=Timestamp(1_700_000_000, 5))
    colon = GaugeMetricFamily("rule:ratio:5m", "Recording-rule style name.", value=0.5)
    utf8 = GaugeMetricFamily("temp.celsius", "Dotted name.", labels=["gpu.id"])
    utf8.add_metric(["0"], 40)
    reserved = GaugeMetricFamily("reserved", "Reserved label name.", labels=["__x"])
    reserved.add_metric(["1"], 1)
    assert_same(registry(Fixed([t, colon, utf8, reserved])))


def test_exemplar_family_takes_the_library_path() -> None:
    c = CounterMetricFamily("req_total", "Requests.", labels=["code"])
    c.add_metric(["200"], 5)
    c.samples[0] = c.samples[0]._replace(exemplar=Exemplar({"trace_id": "f00"}, 0.5, 1_700_000_000))
    reg = registry(Fixed([c]))
    assert b'# {trace_id="f00"} 0.5 1700000000' in openmetrics_latest(reg)
    assert_same(reg)


ODD_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.1, 1e6, 1234567.0, 12345678.9, 1e21, 1e-7, -1e21, 2**53 + 1.0, math.inf,
              -math.inf, math.nan, 5e-324, 1.7976931348623157e308]


@pytest.mark.parametrize("value", [*ODD_FLOATS, 0, 1, 2**63, -7, True, False])
def test_go_float_matches_library(value: float) -> None:
    assert go_float(value) == library_go_float(value)


def test_go_float_matches_library_on_random_bit_patterns() -> None:
    rng = random.Random(20261121)
    for _ in range(20_000):
        value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        assert go_float(value) == library_go_float(value), value


def test_repeated_values_in_one_family_keep_their_sign() -> None:
    # The encoder memoises value strings per family; -0.0 equals 0.0 as a dict key but must print differently.
    g = GaugeMetricFamily("signs", "Signs.", labels=["i"])
    for i, v in enumerate([0.0, -0.0, 0.0, -0.0, math.nan, math.nan, 2.5, 2.5]):
        g.add_metric([str(i)], v)
    reg = registry(Fixed([g]))
    assert b'signs{i="1"} -0.0\n' in text_latest(reg)
    assert_same(reg)


@pytest.mark.parametrize(
    ("accept", "ours"),
    [
        (PROM_ACCEPT, openmetrics_latest),
        ("", text_latest),
        ("text/plain;version=0.0.4", text_latest),
        ("text/plain;version=1.0.0", text_latest),
        ("application/openmetrics-text", openmetrics_latest),
        ("application/openmetrics-text;version=1.0.0;escaping=underscores", openmetrics_latest),
        ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8", None),
        ("text/plain;version=1.0.0;escaping=values", None),
        ("application/openmetrics-text;version=2.0.0", None),
    ],
)
def test_fast_encoder_covers_the_default_escaping_only(accept: str, ours: object) -> None:
    chosen, _ = exposition.choose_encoder(accept)
    fast = fast_encoder(chosen)
    assert fast is ours
    reg = daemon_registry()
    if fast is not None:
        assert fast(reg) == chosen(reg)


def test_a_frozen_family_is_encoded_once_per_format() -> None:
    g = GaugeMetricFamily("frozen", "Frozen.", labels=["x"])
    g.add_metric(["a"], 1)
    assert freeze(g) is g
    reg = registry(Fixed([g]))
    first_om, first_text = openmetrics_latest(reg), text_latest(reg)
    assert first_om == library_openmetrics(reg) and first_text == exposition.generate_latest(reg)
    # Frozen is a promise not to change; the encoders hold it to that and serve the first encoding.
    g.add_metric(["b"], 2)
    assert openmetrics_latest(reg) == first_om and text_latest(reg) == first_text
    assert b'frozen{x="b"}' in library_openmetrics(reg)


def test_scrapes_of_a_changing_store_stay_identical_to_the_library() -> None:
    # Per-GPU families are reused between snapshots with the same samples; the bytes must not notice.
    store = store_from_fixture("store_mixed.json")
    reg = registry(StoreCollector(store, build=BUILD))
    assert_same(reg)
    assert_same(reg)
    latest = store.latest
    assert latest is not None
    store.apply(replace(latest, timestamp=latest.timestamp + 1))
    assert_same(reg)
    store.apply(replace(latest, timestamp=latest.timestamp + 2, gpus=latest.gpus[:1]))
    assert_same(reg)


def test_owner_labels_on_some_process_samples_encode_identically() -> None:
    """Per-process samples whose owner labels differ in number (absent, never empty, where unknown) encode as the
    library would, and gpuwatchd_gpu_pod_info / attribution errors too."""
    from gpuwatchd.model import Attribution, GpuPod, ProcessOwner

    store = store_from_fixture("store_mixed.json")
    assert store.latest is not None
    procs = list(dict.fromkeys((g.uuid, p.pid) for g in store.latest.gpus for p in g.processes))
    assert len(procs) >= 2
    owners = {procs[0]: ProcessOwner(container_id="3f2a9c1b7d4e", namespace="ml", pod="trainer-0",
                                     container="trainer", runtime="containerd"),
              procs[1]: ProcessOwner(hpc_job="4242")}
    store.set_attribution(Attribution(timestamp=store.latest.timestamp, owners=owners,
                                      pods=(GpuPod(procs[0][0], "ml", "trainer-0", "trainer"),),
                                      errors={"cgroup": 1, "kubernetes": 0, "hpc_jobs": 0}))
    reg = registry(StoreCollector(store, build=BUILD))
    body = text_latest(reg).decode()
    mem = [line for line in body.splitlines() if line.startswith("gpuwatchd_gpu_process_memory_used_bytes{")]
    first = next(line for line in mem if f'pid="{procs[0][1]}"' in line and procs[0][0] in line)
    assert 'container="trainer",container_id="3f2a9c1b7d4e",namespace="ml",pid=' in first and "hpc_job" not in first
    second = next(line for line in mem if f'pid="{procs[1][1]}"' in line and procs[1][0] in line)
    assert 'hpc_job="4242",pid=' in second and "container" not in second
    assert '=""' not in "".join(line for line in mem if "process=" in line).replace('process=""', "")
    assert 'gpuwatchd_gpu_pod_info{container="trainer"' in body
    assert 'gpuwatchd_attribution_errors_total{source="cgroup"} 1.0' in body
    assert_same(reg)


@pytest.mark.parametrize("library_at", [None, 0, SLICE_SAMPLES + 7])
def test_a_large_family_encoded_in_slices_is_the_same_text(library_at: int | None) -> None:
    # A family of several slices (a per-process family at 16 x 256 holds 4,096 samples) is written a slice at a
    # time between yields; the text is the one-go text, and a sample that needs the library's encoder anywhere in
    # it sends the whole family there, as in one go.
    big = CounterMetricFamily("big_family", "Many samples.", labels=["gpu", "pid"])
    for i in range(3 * SLICE_SAMPLES + 5):
        big.add_metric([str(i % 16), str(i)], float(i % 7) * 1.5)
    if library_at is not None:
        s = big.samples[library_at]
        big.samples[library_at] = s._replace(exemplar=Exemplar({"trace_id": "abc"}, 1.0, 12.0))
    small = CounterMetricFamily("small_total", "Few.", labels=["x"])
    small.add_metric(["a"], 3)
    frozen = freeze(GaugeMetricFamily("frozen_big", "Frozen and large.", labels=["i"]))
    for i in range(SLICE_SAMPLES + 1):
        frozen.add_metric([str(i)], i)
    reg = registry(Fixed([small, big, frozen]))
    for encoder, library in ((openmetrics_latest, library_openmetrics), (text_latest, exposition.generate_latest)):
        metrics = list(reg.collect())
        sliced = asyncio.run(encode_yielding(metrics, encoder))
        assert sliced == encoder(reg) == library(reg)
        # The frozen family's text was kept: a second encode reuses it.
        assert asyncio.run(encode_yielding(metrics, encoder)) == sliced
