"""The Prometheus collector over the store: families built fresh from the store, no I/O, never a failed scrape.

Per-GPU families are built once per snapshot (snapshots are immutable) and reused by every scrape of it; the other
groups are built on every scrape.

``collect()`` runs on the event loop inside the ``/metrics`` handler, so it only reads the in-memory store. It is
split into groups (node_exporter style); a group that raises is logged (rate-limited) and counted in
``gpuwatchd_exporter_collect_errors_total{group}``, and the scrape goes on with the other groups.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwatchd.exporter import attribution_families as af
from gpuwatchd.exporter import dock_families as df
from gpuwatchd.exporter import fabric_families as ff
from gpuwatchd.exporter import gpm_families as gm
from gpuwatchd.exporter import gpu_families as gf
from gpuwatchd.exporter import health_families as hf
from gpuwatchd.exporter import kernel_log_families as kf
from gpuwatchd.exporter import mig_families as mf
from gpuwatchd.exporter import nvlink_families as nf
from gpuwatchd.exporter import probe_families as pf
from gpuwatchd.exporter import runtime_families as rf
from gpuwatchd.exporter import training_families as tf
from gpuwatchd.exporter.encode import freeze
from gpuwatchd.exporter.families import Spec, spec
from gpuwatchd.model import GpuSample, ProcessSample
from gpuwatchd.store import Store

log = logging.getLogger(__name__)

# A broken group fails on every scrape (every 15 s per Prometheus); one traceback a minute is enough to act on.
ERROR_LOG_INTERVAL_SECONDS = 60.0

COLLECT_ERRORS = spec(
    "gpuwatchd_exporter_collect_errors_total", "counter",
    "Scrapes in which a group of metric families failed to build and was left out (see the daemon log).",
    ("group",),
)

Group = Callable[[Store], Iterable[Metric]]


def store_specs() -> list[Spec]:
    """Every family the store collector can export."""
    mods = (rf, gf, df, kf, pf, nf, ff, gm, mf, hf, af, tf)
    found = [v for mod in mods for v in vars(mod).values() if isinstance(v, Spec)]
    return [*found, COLLECT_ERRORS]


def present_gpus(store: Store) -> list[GpuSample]:
    """Samples of GPUs that are present now: a lost or removed GPU exports no readings."""
    snap = store.latest
    if snap is None:
        return []
    pres = store.presence
    return [g for g in snap.gpus if (p := pres.get(g.uuid)) is None or p.state == "present"]


def _same(a: list[GpuSample], b: list[GpuSample]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


# What the per-process families of one GPU are built from: its uuid, process count and process tuple.
_ProcessInputs = tuple[str, int | None, tuple[ProcessSample, ...]]


def _same_processes(a: list[_ProcessInputs], b: list[_ProcessInputs]) -> bool:
    return len(a) == len(b) and all(
        x[0] == y[0] and x[1] == y[1] and _same_objects(x[2], y[2]) for x, y in zip(a, b, strict=True))


def _same_objects(a: tuple[ProcessSample, ...], b: tuple[ProcessSample, ...]) -> bool:
    # The decoder keeps an unchanged process' object, and the tuple too when the whole list is unchanged; a list
    # with a dead process (its age moves every poll) is a new tuple of the same objects.
    return a is b or (len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True)))


class StoreCollector(Collector):
    """Exports what the store holds about GPUs, NVML and the daemon; other subsystems register their own."""

    def __init__(
        self,
        store: Store,
        *,
        build: rf.BuildInfo | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], float] | None = None,
    ) -> None:
        self._store = store
        self._now = now  # the daemon's clock, for gpuwatchd_gpu_reading_age_seconds
        self._build = build if build is not None else rf.BuildInfo.detect()
        self._monotonic = monotonic
        self.groups: dict[str, Group] = {
            "nvml": rf.nvml_families,
            "presence": self._presence,
            "gpu": self._per_gpu("gpu", gf.value_families),
            "clocks": self._per_gpu("clocks", gf.clock_families),
            "health": self._per_gpu("health", gf.health_families),
            "pcie": self._per_gpu("pcie", gf.pcie_families),
            "processes": self._processes,
            "xid": rf.xid_families,
            "links": lambda s: rf.link_families(s.links),
            "thunderbolt": df.dock_families,
            "kernel_log": kf.kernel_log_families,
            "self": lambda s: rf.self_families(s, self._build),
            "probes": pf.probe_families,
            "nvlink": self._per_gpu("nvlink", nf.nvlink_families),
            "fabric": self._per_gpu("fabric", ff.fabric_families),
            "gpm": self._per_gpu("gpm", gm.gpm_families),
            "mig": self._per_gpu("mig", mf.mig_families),
            "gpu_health": hf.health_families,
            "attribution": af.attribution_families,
            "training": lambda s: tf.training_families(
                present_gpus(s), s.training, s.attribution.owners if s.attribution is not None else None),
        }
        self.errors: dict[str, int] = dict.fromkeys(self.groups, 0)
        # group -> (the GPU samples its families were built from, the families, frozen)
        self._built: dict[str, tuple[list[GpuSample], list[Metric]]] = {}
        self._built_processes: tuple[list[_ProcessInputs], list[Metric]] | None = None
        self._built_owners: object = None
        self._driver: str | None = None
        self._last_logged: dict[str, float] = {}

    def _per_gpu(self, name: str, build: Callable[[list[GpuSample]], list[Metric]]) -> Group:
        """A per-GPU group, built once per set of samples rather than once per scrape.

        ``GpuSample`` is immutable and a new poll brings new sample objects, so the same objects mean the same
        families: the /metrics cache re-renders for reasons that leave the GPUs alone (rule evaluations, the
        daemon's 1 s bucket, sysfs links), and then the families and their encoded text are reused
        (``encode.freeze``). Cutting that work is what keeps the scrape p99 down (``bench/scrape.py``).
        """

        def group(store: Store) -> list[Metric]:
            gpus = present_gpus(store)
            built = self._built.get(name)
            if built is not None and _same(built[0], gpus):
                return built[1]
            metrics = [freeze(m) for m in build(gpus)]
            # Kept with the samples: holding them keeps the identity check above sound.
            self._built[name] = (gpus, metrics)
            return metrics

        return group

    def _processes(self, store: Store) -> list[Metric]:
        """Per-process families with owner labels: rebuilt when a present GPU's process list or the owners change.

        They depend only on each present GPU's uuid, process count and process objects, and on the owners map. The
        snapshot decoder hands over the previous poll's objects for unchanged processes, and attribution the
        previous owners map while nobody's owner changed, so on a steady host these families (and
        their encoded text, ``encode.freeze``) are built once and reused across polls: at 16 GPUs x 256 processes
        building and encoding them was the longest stretch a render held the event loop (issue 20).
        """
        gpus = present_gpus(store)
        attribution = store.attribution
        owners = attribution.owners if attribution is not None else None
        inputs = [(g.uuid, g.processes_total, g.processes) for g in gpus]
        built = self._built_processes
        if built is not None and self._built_owners is owners and _same_processes(built[0], inputs):
            return built[1]
        metrics = [freeze(m) for m in gf.process_families(gpus, owners)]
        # Kept with the inputs: holding the tuples and the owners map keeps the identity checks above sound.
        self._built_processes = (inputs, metrics)
        self._built_owners = owners
        return metrics

    def _presence(self, store: Store) -> list[Metric]:
        if store.latest is not None and store.latest.driver_version is not None:
            self._driver = store.latest.driver_version
        return rf.presence_families(store, self._driver, None if self._now is None else self._now())

    def describe(self) -> Iterable[Metric]:
        # Empty families for every name this collector may export: the registry then catches name clashes with
        # other subsystems' collectors at registration, and ``?name[]=`` filtering finds us, without collecting.
        return [s.new() for s in store_specs()]

    def collect(self) -> Iterable[Metric]:
        for name, group in self.groups.items():
            try:
                # Materialise first: a group that fails half-way must not leave half its families in the output.
                metrics = list(group(self._store))
            # One broken group must never fail the scrape (dcgm-exporter answers 500 then: registry.go, server.go).
            except Exception:
                self._failed(name)
                continue
            yield from metrics
        errors = CounterMetricFamily(COLLECT_ERRORS.name, COLLECT_ERRORS.doc, labels=COLLECT_ERRORS.labels)
        for name, count in self.errors.items():
            errors.add_metric([name], count)
        yield errors

    def _failed(self, group: str) -> None:
        self.errors[group] = self.errors.get(group, 0) + 1
        now = self._monotonic()
        last = self._last_logged.get(group)
        if last is None or now - last >= ERROR_LOG_INTERVAL_SECONDS:
            self._last_logged[group] = now
            log.exception(
                "metric group %r failed and was left out of the scrape (%d times so far; logged at most once per %ds)",
                group, self.errors[group], ERROR_LOG_INTERVAL_SECONDS,
            )
