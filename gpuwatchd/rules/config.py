"""Config of the built-in rules (``rules:`` in the YAML file).

Every rule has ``enabled``, ``for`` (how long the condition must hold before the alert fires, Prometheus'
``for:``) and ``keep_firing_for`` (how long a firing alert stays firing after the condition last held, against
flapping; Prometheus' ``keep_firing_for:``). Defaults carry their reason; sources are in ``docs/alerts.md``.

```yaml
rules:
  resolved_retention: 15m
  expected_gpu_count: 8
  leak: {window: 30m, horizon: 24h}
  throttle: {for: 1m, sw_power_cap: true}
  xid: {resolve_after: 1h}
```
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from gpuwatchd.config.types import Duration, PositiveDuration, Section

MIB = 1024 * 1024


class RuleSection(Section, frozen=True):
    """Fields common to every rule; ``for`` is spelled as in Prometheus rule files."""

    populate_by_name: ClassVar[bool] = True

    enabled: bool = True
    for_: Duration = msgspec.field(default=0.0, name="for")
    keep_firing_for: Duration = 0.0


class LeakRule(RuleSection, frozen=True):
    """``GpuMemoryLeak``: robust trend of a process' GPU memory, unattributed GPU memory and host RSS."""

    # A 5 min hold on top of the 10 min minimum span: an allocator pool still growing in steps 10-15 min into a
    # job looks like a stepwise leak for a few minutes; a leak keeps looking like one. This is the hold of a
    # slow leak (hours from OOM); one due sooner holds urgent_hold_share of its time to full instead.
    for_: Duration = msgspec.field(default=300.0, name="for")
    # A leak that stops (memory freed, job ended) resolves after 5 min; a brief plateau inside a leak does not.
    keep_firing_for: Duration = 300.0
    # How often the trend is recomputed (it is the costliest rule: ~0.2 s for 16 GPUs x 10 processes); in
    # between, the last result stands. The trend moves in 1 min buckets, so 30 s loses nothing.
    interval: Duration = 15.0
    # The trend window. 30 min covers several checkpoint/evaluation cycles of a training loop and fits the
    # store's default 1 h retention; half of it is the "recent" slope.
    window: PositiveDuration = 1800.0
    # Less history than this is never a leak: caching-allocator warm-up takes the first minutes of a job.
    min_span: PositiveDuration = 600.0
    # The lower envelope is built from one floor (low quantile) per bucket: spikes vanish, and Theil-Sen runs on
    # window/bucket (30) points, so its O(n²) pairs stay cheap without numpy.
    bucket: PositiveDuration = 60.0
    # 1 MiB/min: below it a 24 GiB GPU lasts more than two weeks; slower drift is allocator fragmentation, not a
    # trend worth a message.
    min_rate_bytes_per_second: Annotated[float, msgspec.Meta(gt=0)] = 17476.0  # = 1 MiB/min
    # Fire when the projected time to full is within this horizon ...
    horizon: Duration = 86400.0
    # ... or when the growth over the window is at least this share of GPU memory, whatever the projection.
    min_growth_ratio: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.10
    # Never on less growth than this share of GPU memory (245 MiB of 24 GiB): projecting a full GPU from a few
    # tens of MiB is guesswork (csv04's floor creeps ~60 MiB in 10 min under steady inference).
    floor_growth_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.01
    # The recent half must grow at least this fraction of the whole-window rate: warm-up is concave (fast then
    # flat) and fails this; a linear or accelerating leak passes.
    min_recent_ratio: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5
    # The envelope must rise in at least this many buckets of the recent half: one step is a warm-up or an
    # epoch boundary; a leak keeps stepping.
    min_recent_rises: Annotated[int, msgspec.Meta(ge=1)] = 2
    # ... and by at least this many noise sigmas (robust scatter of the bucket floors around their trend line):
    # 3 sigma keeps the end effect of a noisy plateau's envelope from looking like growth.
    noise_factor: Annotated[float, msgspec.Meta(ge=0)] = 3.0
    # Urgency: a leak projected to fill the GPU soon is judged on short windows (2-8 min) and held for less, so
    # the message comes with time left to act. Off: every leak waits min_span + for.
    urgent: bool = True
    # On a short window, the growth seen must span at least this share of the projected time to full: a leak
    # due in 20 min is judged on 6 min of growth, one due in 2 h on the long window. With the hold below, a
    # linear leak fires at ~1/3 of its time to OOM, leaving ~2/3 to act; a ramp that stops (model loading, a
    # long warm-up) stays silent unless it ate about a third of the free memory first. In bench/detect.py
    # --seeds 16, 0.25 with a hold share of 0.1 or 0.2 fired on a 10 min stepwise warm-up; 0.3/0.3 on nothing,
    # and every leak still fired with >= 25 % of its time to OOM left.
    urgent_evidence_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.15
    # The for: hold of a leak: this share of its projected time to full, between urgent_min_hold and for. The
    # hold is the proof that the growth goes on (pending fires only while the floor still rises).
    urgent_hold_share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.1
    # The evidence share and hold share of a rough rise on a short window (an irregular staircase, a noisy ramp:
    # its growth under onset_min_snr times its scatter): a long warm-up stepping at random for 8-12 min looks like
    # a fast staircase leak until it stops, so a rough rise waits 0.3 x its time to full twice, as before onsets.
    # A regular staircase (steps of a steady size at a steady period, rules/leak/steps.py) counts as clean.
    urgent_rough_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.3
    # The shortest hold: two leak evaluations (interval 15 s), so one trend computation never fires on its own.
    urgent_min_hold: Duration = 30.0
    # Onset (gpuwatchd/rules/leak/onset.py): a series is judged from where its growth began, and a clean straight rise
    # fires without waiting for min_span. Off: every leak is judged on the window as before.
    onset: bool = True
    # The least evidence since the onset: 4 min shows whether a rise flattens (a warm-up or a saturating job
    # with a time constant under ~15 min bends its quadratic fit below onset_min_straightness within that).
    onset_min_span: Duration = 240.0
    # Growth since the onset must be this many times the scatter around its line: the cleaner the fit, the
    # fewer minutes it takes (a noisy leak reaches it later; a staircase does not, and is judged by its steps on
    # the short windows or waits for min_span).
    onset_min_snr: Annotated[float, msgspec.Meta(gt=0)] = 15.0
    # ... and it needs this share of floor_growth_ratio of growth (a clean straight rise of 120 MiB on a 24 GiB GPU
    # is a trend; csv04's noisy 60 MiB creep fails onset_min_snr, not this).
    onset_floor_share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    # Quadratic fit of the envelope since the onset: slope at the end / slope at the start must be at least this.
    onset_min_straightness: Annotated[float, msgspec.Meta(gt=0)] = 0.75
    # The longest hold of a leak judged from its onset (a slow leak with a clean fit: six evaluations at 15 s);
    # one due sooner holds urgent_hold_share of its time to full as above. In bench/detect.py 90 s kept
    # false_alerts 0 and brought the median delay of leaks >= 1 h from full to 465 s (120 s: 495 s).
    onset_hold: Duration = 90.0
    # A process the daemon saw start settles its caching allocator first; growth that slows within this long
    # after it appeared is warm-up, not the start of a leak.
    settle: Duration = 300.0
    # A process seen starting less than young_age ago is young: its growth (a caching allocator meeting new input
    # shapes, ever more rarely) is warm-up while it decelerates: a spreading staircase, or a rise that levels off
    # with room left in free memory, keeps a pending alert but cannot fire it (bench/detect.py: shape-warmup*).
    young_age: Duration = 900.0
    # The trend of the rate: a rise judged on the long window or from its onset whose quadratic fit flattens
    # (end slope under level_off_straightness of its start slope) is a saturating job, not a leak, when
    # level_off_margin times the growth left to the fit's peak still fits in the GPU's headroom (a quadratic
    # reaches the level of an exponential saturation with about half its growth: 3 leaves room for that).
    level_off_straightness: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.8
    # How many times the growth left to the quadratic fit's peak must fit in the headroom for the rise to count
    # as levelling off (0: every flattening rise does).
    level_off_margin: Annotated[float, msgspec.Meta(ge=0)] = 3.0
    # The trend of the rate across the evidence, for a young process (rules/leak/saturation.py): a rise whose recent
    # half climbs at under warmup_rate_ratio of its early half's rate decelerates; followed as its rate decays, it
    # levels off when warmup_margin times the growth still to come fits in the free memory: a warm-up (dynamic
    # shapes, bucketed lengths, autotuning), not a leak, whichever evidence (short window, onset, window) judged it.
    warmup_rate_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.8
    warmup_margin: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    # A series whose start was not seen (the daemon started or lost its history while the job ran, and no flat
    # stretch precedes the growth) is judged on the window only, with these stricter shape tests and the full
    # for: hold (a saturating job seen from its middle looks linear for minutes).
    unseen_min_recent_ratio: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.7
    unseen_min_straightness: Annotated[float, msgspec.Meta(gt=0)] = 0.8
    # On the long window (min_span or more), a series seen from its start must not flatten more than this (a
    # saturating job's quadratic fit does; a staircase leak's, judged by its steps, stays near 1).
    min_straightness: Annotated[float, msgspec.Meta(gt=0)] = 0.5
    unattributed: bool = True
    host_rss: bool = True
    # Host RSS has no "total" to project against; fire when it grew this much over the window (pinned buffers
    # are allocated in MiB-to-GiB chunks, so a real pinned-memory leak clears this within the window).
    host_rss_min_growth_bytes: Annotated[int, msgspec.Meta(gt=0)] = 512 * MIB
    # Host RSS has no time-to-full, so no urgency; its for: is longer than the GPU's because DataLoader workers
    # fill prefetch queues and caches for 5-15 min before levelling off, which looks like a pinned-memory leak
    # until it stops (a pinned leak keeps growing through the hold; host memory is usually far larger).
    host_rss_for: Duration = 900.0

    def check(self) -> None:
        if self.min_span > self.window:
            raise ValueError("min_span must not exceed window")
        if self.bucket * 4 > self.min_span:
            raise ValueError("bucket must be at most a quarter of min_span (the trend needs points)")


class ThrottleRule(RuleSection, frozen=True):
    """``GpuThrottled``: harmful clocks-event reasons sustained."""

    # DCGM's thermal/power health watches need 1 min of data before they answer (DCGM DcgmHealthWatch.cpp).
    for_: Duration = msgspec.field(default=60.0, name="for")
    # The reason's share of samples is taken over this short window, so a reason flickering every other poll
    # still counts while a single sample does not.
    window: PositiveDuration = 30.0
    min_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5
    # Hysteresis: once firing, any activity in the window keeps it firing; it clears on a window with none.
    clear_share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    # The "share of time throttled" in the message is over this span.
    report_window: PositiveDuration = 300.0
    # SW power cap is the board doing its job at its power limit; alert on it only when asked, and only busy.
    sw_power_cap: bool = False
    busy_utilization: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5


class XidRule(RuleSection, frozen=True):
    """``GpuXidError``: an Xid is an event, not a level; the alert fires at once and resolves after quiet."""

    # An hour without a repeat: Xids of one fault come in bursts of seconds to minutes (kern01: Xid 48, 63 and
    # nine 94s within a second), so an hour of quiet means the episode is over.
    resolve_after: Duration = 3600.0
    # Codes never alerted on (still counted in gpuwatchd_xid_errors_total).
    ignore: tuple[int, ...] = ()


class XidRepeatRule(RuleSection, frozen=True):
    """``GpuXidRepeated`` and ``GpuXidSupportCase``: escalations read from the Xid history (rules/xid_repeat.py)."""

    # How far back repeats count: a day, like NVSentinel's 24 h for fatal Xids.
    window: PositiveDuration = 86400.0
    # Application-level codes: once is the job's bug, repeated across jobs on one GPU is the GPU.
    app_codes: tuple[int, ...] = (13, 31, 43)
    # Jobs (distinct pids, or bursts when the pid is unknown) on one GPU before an application code points at it.
    min_jobs: Annotated[int, msgspec.Meta(ge=2)] = 3
    # Events of one code without a pid closer than this are one job's burst; fatal Xids closer than this, one
    # episode. 3 min: NVIDIA's and NVSentinel's burst window for Xid 31.
    burst_gap: PositiveDuration = 180.0
    # Fatal-class (critical) Xid episodes on one GPU within the window that make a support case: each already
    # asked for a reset or a reboot, so the third means the recovery does not hold.
    fatal_count: Annotated[int, msgspec.Meta(ge=2)] = 3


class EccRule(RuleSection, frozen=True):
    """``GpuEccError``: volatile DBE, retired pages, row remapping (DCGM MEM health watch, DcgmHealthWatch.cpp)."""

    # DCGM: SBE+DBE retired pages >= 63 -> FAIL.
    retired_pages_max: Annotated[int, msgspec.Meta(ge=1)] = 63


class LinkRule(RuleSection, frozen=True):
    """``GpuPcieLinkDegraded``: link below its maximum while the GPU is busy (idle links downshift by design)."""

    # Under load the link trains back up within seconds; 2 min below max under load is not a transition.
    for_: Duration = msgspec.field(default=120.0, name="for")
    busy_utilization: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    # Hysteresis: a firing alert holds while the link is still below max and the GPU is at least this busy.
    clear_utilization: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.2


class ReplayRule(RuleSection, frozen=True):
    """``GpuPcieReplays``: replay rate above DCGM's per-lane allowance (DCGM PCIE health watch, DcgmHealthWatch.cpp)."""

    # DCGM counts replays per minute.
    window: PositiveDuration = 60.0
    # Replays come in bursts: a firing alert holds (its summary giving the rate now) until the rate has stayed under
    # the allowance this long, so it does not resolve and re-fire on every quiet minute ...
    resolve_after: PositiveDuration = 600.0
    # ... or until not one replay came for this long while the GPU was busy (rules.link.busy_utilization): a link
    # that replayed at many times its allowance and now carries traffic cleanly has been fixed (cable replaced).
    clean_after: PositiveDuration = 120.0


class PresenceRule(RuleSection, frozen=True):
    """``GpuLost``, ``GpuRemoved``: presence state from the store (for 0: a vanished GPU is news at once)."""


class CountRule(RuleSection, frozen=True):
    """``GpuCountLow``: fewer GPUs present than ``rules.expected_gpu_count``."""

    # A worker re-enumeration takes seconds; a GPU missing for a minute is missing.
    for_: Duration = msgspec.field(default=60.0, name="for")


class TemperatureRule(RuleSection, frozen=True):
    """``GpuTemperatureHigh``: within ``margin`` °C of the driver's slowdown threshold."""

    for_: Duration = msgspec.field(default=60.0, name="for")
    # 5 °C: NVIDIA boards put their max operating temperature 5-10 °C below the HW slowdown threshold (sim-state
    # example: slowdown 95, gpu_max 88), so a GPU this close is past its operating range and about to halve
    # its clocks.
    margin_celsius: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    # Hysteresis: once firing, clear only 3 °C lower (separate raise/clear thresholds, against flapping).
    clear_margin_celsius: Annotated[float, msgspec.Meta(ge=0)] = 8.0

    def check(self) -> None:
        if self.clear_margin_celsius < self.margin_celsius:
            raise ValueError("clear_margin_celsius must be >= margin_celsius")


class DockUnauthorizedRule(RuleSection, frozen=True):
    """``GpuDockUnauthorized``: a Thunderbolt dock attached without a PCIe tunnel (docs/egpu.md)."""

    # boltd authorizes an enrolled device within a second or two of the plug; only one still waiting after
    # this is a dock nobody approved.
    for_: Duration = msgspec.field(default=30.0, name="for")


class DockLinkRule(RuleSection, frozen=True):
    """``GpuDockLinkDegraded``: a Thunderbolt link trained below its generation (one lane, or 10 Gb/s lanes)."""

    # Link training settles within seconds of the plug; a link still low after a minute stays low until re-plugged.
    for_: Duration = msgspec.field(default=60.0, name="for")


class ProbeRule(RuleSection, frozen=True):
    """``GpuProbeFailed`` and ``GpuPerformanceDegraded``: verdicts of the torch health probes (docs/probes.md)."""

    # A measure below this share of the GPU's own baseline (or PCIe bandwidth below this share of what its link
    # should give) on two consecutive runs is degraded: 0.8 is well outside run-to-run noise on an idle GPU.
    degraded_ratio: Annotated[float, msgspec.Meta(gt=0, lt=1)] = 0.8


class RuleFailingRule(RuleSection, frozen=True):
    """``GpuwatchdRuleFailing``: a rule family raised at every evaluation for ``for``, so its alerts cannot fire."""

    # A family raising once (a reading it did not expect) is logged and counted; one raising at every evaluation
    # for 5 min is broken, and the GPUs it watches are unwatched.
    for_: Duration = msgspec.field(default=300.0, name="for")


class NvlinkRule(RuleSection, frozen=True):
    """``GpuNvlinkErrors``: NVLink error counters rising on a link (DCGM NVLINK health watch, DcgmHealthWatch.cpp)."""

    # DCGM's health watches look at the last 60 s of samples.
    window: PositiveDuration = 60.0
    # DCGM: CRC errors at or above 100/s -> FAIL (critical); any below that -> WARN; any replay or recovery -> FAIL.
    crc_critical_per_second: Annotated[float, msgspec.Meta(gt=0)] = 100.0
    # Errors come in bursts; do not resolve and re-fire on every quiet minute.
    keep_firing_for: Duration = 600.0


class FabricRule(RuleSection, frozen=True):
    """``GpuFabricNotReady``: a GPU of an NVLink fabric not registered with it (nvmlDeviceGetGpuFabricInfoV)."""

    # Registration takes seconds after the driver and the Fabric Manager start; 2 min covers a slow boot.
    for_: Duration = msgspec.field(default=120.0, name="for")


class NvSwitchRule(RuleSection, frozen=True):
    """``NvSwitchError``: SXid errors of an NVSwitch in the kernel log (critical when fatal)."""

    # How long after its last SXid a switch's alert holds: SXids come in bursts (one per link, with detail lines).
    window: PositiveDuration = 600.0


class RecoveryRule(RuleSection, frozen=True):
    """``GpuRecoveryActionRequired``: the driver's GPU recovery action (nvmlDeviceGpuRecoveryAction_t) is not none."""


class UnderutilizedRule(RuleSection, frozen=True):
    """``GpuUnderutilized`` (info): GPU memory held while the SMs sit idle, on a shared host."""

    # Off by default: on a single-user box an idle GPU is its owner's business; on a shared host it is worth
    # telling the owner of the process that holds it.
    enabled: bool = False
    # "For a long time": 30 min idles past a checkpoint, an evaluation pass or a coffee break; a data loader
    # starving the GPU for that long is the job's normal state, not a pause.
    for_: Duration = msgspec.field(default=1800.0, name="for")
    # Busy by memory: at least this share of the GPU's memory is in use ...
    min_memory_ratio: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.25
    # ... while SM activity (GPM; else utilization.gpu) is at most this: starts the alert.
    max_activity_ratio: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.05
    # A pending or firing alert holds while activity stays at most this (a stalled job's short bursts).
    clear_activity_ratio: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.15

    def check(self) -> None:
        if self.clear_activity_ratio < self.max_activity_ratio:
            raise ValueError("clear_activity_ratio must be >= max_activity_ratio")


class DeadProcessRule(RuleSection, frozen=True):
    """``GpuMemoryHeldByDeadProcess``: GPU memory held by pids with no process, or used with no process listed."""

    # A process that exits releases its GPU memory within seconds (the driver tears its contexts down as its
    # /dev/nvidia* files close; a large job's teardown can take tens of seconds), and NVML may list the pid for a
    # poll or two after /proc lost it. Still held 2 minutes later, it is held for good.
    for_: Duration = msgspec.field(default=120.0, name="for")
    # How often the family runs (it walks every listed process); the hold is minutes, 10 s loses nothing.
    interval: Duration = 10.0
    # A dead pid holding less than this is not worth a message (NVML reports a few MiB for a context mid-teardown).
    min_memory_bytes: Annotated[int, msgspec.Meta(ge=0)] = 64 * MIB
    # A GPU listing no process while this much memory is used: an idle GPU uses a few MiB to a few hundred MiB
    # (driver-internal allocations; more with ECC and large BAR1 mappings), far under 1 GiB.
    unattributed_min_bytes: Annotated[int, msgspec.Meta(gt=0)] = 1024 * MIB
    # ... for this long: a job's exit frees its memory within seconds and the next one starts within minutes;
    # 10 min of memory with nobody holding it is not a hand-over between jobs.
    unattributed_for: Duration = 600.0


class RulesConfig(Section, frozen=True):
    """``rules:``: the built-in alert rules."""

    # Prometheus keeps sending resolved alerts for 15 min (rules/alerting.go resolvedRetention).
    resolved_retention: Duration = 900.0
    # Unset: no GpuCountLow (like gpud, the check is skipped without an expectation).
    expected_gpu_count: Annotated[int, msgspec.Meta(ge=1)] | None = None
    leak: LeakRule = LeakRule()
    throttle: ThrottleRule = ThrottleRule()
    xid: XidRule = XidRule()
    xid_repeat: XidRepeatRule = XidRepeatRule()
    ecc: EccRule = EccRule()
    link: LinkRule = LinkRule()
    replays: ReplayRule = ReplayRule()
    presence: PresenceRule = PresenceRule()
    count: CountRule = CountRule()
    temperature: TemperatureRule = TemperatureRule()
    dock_unauthorized: DockUnauthorizedRule = DockUnauthorizedRule()
    dock_link: DockLinkRule = DockLinkRule()
    probe: ProbeRule = ProbeRule()
    rule_failing: RuleFailingRule = RuleFailingRule()
    nvlink: NvlinkRule = NvlinkRule()
    recovery: RecoveryRule = RecoveryRule()
    fabric: FabricRule = FabricRule()
    nvswitch: NvSwitchRule = NvSwitchRule()
    underutilized: UnderutilizedRule = UnderutilizedRule()
    dead_process: DeadProcessRule = DeadProcessRule()
