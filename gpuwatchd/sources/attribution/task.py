"""The attribution source: resolves every GPU process' owner after each snapshot and refreshes the slow sources
(kubelet, job-mapping directory) on a schedule.

- Per snapshot (:meth:`AttributionTask.resolve`, on the event loop): ``/proc/PID/cgroup`` of processes not seen
  before (re-read after :data:`CGROUP_RECHECK_SECONDS`, dropped when they leave the top-N), the runtime's files of
  new containers (cached by container id), and the last kubelet/job answers. No network, no blocking call.
- Every ``attribution.kubernetes.interval`` (:meth:`AttributionTask.run`): ``List`` on the kubelet's socket in a
  thread with a deadline, and the job-mapping directory. A missing, slow or broken socket is counted in
  ``gpuwatchd_attribution_errors_total{source="kubernetes"}``, logged once per streak, and the last good answer is
  dropped from ``gpuwatchd_gpu_pod_info`` (stale pods would name the wrong owner) while the owner a container
  was already given stays with it (a container never changes pods); the loop goes on.

Rules for an owner (never a guess): a host process (a cgroup outside any container) gets no container and no
pod; a process in a pod's cgroup gets the pod named by its runtime's files, else the pod holding its GPU when the
kubelet lists exactly one container for it (a shared GPU with no runtime files leaves the pod unknown); the job
is the process' Slurm cgroup's, else the mapping directory's for its GPU (processes outside containers only).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection

from gpuwatchd.config.attribution import DEFAULT_POD_RESOURCES_SOCKET, AttributionConfig
from gpuwatchd.model import Attribution, GpuPod, GpuSample, ProcessOwner, Snapshot, SourceStatus
from gpuwatchd.sources.attribution import cgroup as cg
from gpuwatchd.sources.attribution.hpc_jobs import job_label, read_jobs
from gpuwatchd.sources.attribution.runtime_meta import ContainerMeta, read_meta

log = logging.getLogger(__name__)

CGROUP_RECHECK_SECONDS = 30.0  # a pid's cgroup is re-read this often (pid reuse within the top-N set)
# Re-reads of due cgroups per resolve: at least this many, or a tenth of the cached pids. The pids listed together
# are read together and fall due together, so at 16 GPUs x 256 processes every 30 s one poll re-read 4,096 files
# on the event loop (40-50 ms); capped, the due re-reads are spread over ~10 polls (each a few ms), and after the
# first round their times stay spread. A re-read comes a few polls late at most; a new pid is always read at once.
CGROUP_REREADS_MIN = 64
MAX_META_CACHE = 4096  # container ids whose runtime files were read; cleared when it grows past this

SOURCES = ("cgroup", "kubernetes", "hpc_jobs", "runtime")


class AttributionTask:
    """Owner resolution state for one daemon. Not thread-safe: the event loop owns it (List runs in a thread
    but only its result comes back)."""

    def __init__(
        self,
        config: AttributionConfig,
        *,
        socket_explicit: bool | None = None,
        on_update: Callable[[], None] | None = None,
        on_status: Callable[[SourceStatus], object] | None = None,
        wall: Callable[[], float] = time.time,
        read_proc: bool = True,
    ) -> None:
        self.config = config
        # False under the stand-in driver with the host's /proc: its pids are fictitious, and a real process that
        # happens to have one of them must not lend it its container.
        self._read_proc = read_proc
        k8s = config.kubernetes
        self._socket_explicit = (
            socket_explicit if socket_explicit is not None
            else k8s.pod_resources_socket != DEFAULT_POD_RESOURCES_SOCKET
        )
        self._on_update = on_update or (lambda: None)
        self._on_status = on_status or (lambda s: None)
        self._wall = wall
        self.errors = dict.fromkeys(SOURCES, 0)
        self._failing: dict[str, bool] = dict.fromkeys(SOURCES, False)
        self._cgroups: dict[int, tuple[float, cg.CgroupOwner | None]] = {}
        self._cgroup_failed: set[int] = set()
        self._meta: dict[str, ContainerMeta | None] = {}
        # container id -> (namespace, pod, container) once known: a container never changes pods, so its owner
        # outlives a kubelet outage or restart (alerts keep their labels instead of resolving and re-firing)
        self._pod_of: dict[str, tuple[str, str, str]] = {}
        # Set when a resolve taught _pod_of a container's pod: a process of that container listed before the one
        # that taught it did not get it in that pass, so the owners are made again at the next resolve.
        self._pod_of_learned = False
        self.pods: tuple[GpuPod, ...] = ()
        self._pods_by_uuid: dict[str, list[GpuPod]] = {}
        self.jobs: dict[int, tuple[str, ...]] = {}
        self._pods_skipping = False  # the last List answer had allocations skipped (logged once)
        self._jobs_skipping = False  # the last refresh skipped something in the mapping directory (logged once)
        self.kubelet_seen = False  # the socket existed at some point (a vanished socket is then an error)
        self.refreshes = 0
        # The last resolve's answer and what it depended on: the kubelet/job answers (a count bumped when they are
        # set), and which pids each GPU listed. While those stay the same and no pid's cgroup is due for its
        # re-read, the owners are the same (16 GPUs x 256 processes: 4096 look-ups a poll spared).
        self._inputs = 0
        self._last: tuple[int, list[tuple[str, int, str | None, list[int]]], dict[tuple[str, int], ProcessOwner]] \
            | None = None
        self._recheck_at = 0.0  # the earliest re-read due among the cached cgroups
        self._rereads = 0  # re-reads of due cgroups left in this resolve (CGROUP_REREADS_MIN)

    # -- slow sources, on a schedule ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Refresh the kubelet and job answers every interval until cancelled."""
        while True:
            await self.refresh()
            await asyncio.sleep(self.config.kubernetes.interval)

    async def refresh(self) -> None:
        await self._refresh_pods()
        await self._refresh_jobs()
        self.refreshes += 1
        self._on_update()

    async def _refresh_pods(self) -> None:
        k8s = self.config.kubernetes
        sock = k8s.pod_resources_socket
        if not sock.exists():
            if self._socket_explicit or self.kubelet_seen:
                self._set_pods(())
                self._fail("kubernetes", f"pod-resources socket {sock} does not exist (is the kubelet's "
                                         "pod-resources directory mounted?)", 0.0)
            return
        self.kubelet_seen = True
        from gpuwatchd.sources.attribution.kubelet import PodResourcesError, list_gpu_pods

        t0 = time.monotonic()
        try:
            # A thread, not the loop: grpc's blocking call honours the deadline; a hung kubelet costs one thread
            # for `timeout` seconds, never the loop.
            pods = await asyncio.to_thread(list_gpu_pods, sock, k8s.timeout)
        except PodResourcesError as e:
            self._set_pods(())
            self._fail("kubernetes", f"pod-resources List failed ({e}); GPU pods unknown until it answers",
                       time.monotonic() - t0)
            return
        except Exception as e:  # a stub/protobuf mismatch must not end the loop either
            self._set_pods(())
            self._fail("kubernetes", f"pod-resources List failed: {type(e).__name__}: {e}", time.monotonic() - t0)
            return
        self._set_pods(pods.pods)
        if pods.skipped:
            self.errors["kubernetes"] += 1  # per refresh that skipped something, said once
            if not self._pods_skipping:
                self._pods_skipping = True
                log.warning("pod-resources List: %d GPU allocations skipped (first: %s)", pods.skipped,
                            pods.first_problem)
        else:
            self._pods_skipping = False
        self._ok("kubernetes", f"pod-resources List answers again ({len(pods.pods)} GPU allocations)",
                 time.monotonic() - t0)

    def _set_pods(self, pods: tuple[GpuPod, ...]) -> None:
        self.pods = pods
        self._inputs += 1
        by: dict[str, list[GpuPod]] = {}
        for p in pods:
            by.setdefault(p.uuid, []).append(p)
        self._pods_by_uuid = by

    async def _refresh_jobs(self) -> None:
        d = self.config.hpc_job_mapping_dir
        if d is None:
            return
        t0 = time.monotonic()
        try:
            # A thread: the directory is written by scripts and may hold thousands of entries.
            found = await asyncio.to_thread(read_jobs, d)
        except OSError as e:
            self._set_jobs({})
            self._fail("hpc_jobs", f"HPC job mapping directory {d} unreadable: {e.strerror or e}",
                       time.monotonic() - t0)
            return
        self._set_jobs(found.jobs)
        if found.skipped:
            # Counted per refresh that skipped something, said once: the files the site writes are read again
            # every interval, so a bad one would otherwise log every 10 s.
            self.errors["hpc_jobs"] += 1
            if not self._jobs_skipping:
                self._jobs_skipping = True
                log.warning("HPC job mapping directory %s: %d entries or lines skipped (first: %s)",
                            d, found.skipped, found.first_problem)
        else:
            self._jobs_skipping = False
        self._ok("hpc_jobs", f"HPC job mapping directory {d} readable again", time.monotonic() - t0)

    def _set_jobs(self, jobs: dict[int, tuple[str, ...]]) -> None:
        self.jobs = jobs
        self._inputs += 1

    def _fail(self, source: str, message: str, duration: float) -> None:
        self.errors[source] += 1
        if not self._failing[source]:
            self._failing[source] = True
            log.warning("%s", message)
        self._on_status(SourceStatus(f"attribution_{source}", False, duration, self._wall(), message[:200]))

    def _ok(self, source: str, message: str, duration: float) -> None:
        if self._failing[source]:
            self._failing[source] = False
            log.info("%s", message)
        self._on_status(SourceStatus(f"attribution_{source}", True, duration, self._wall()))

    # -- per snapshot ------------------------------------------------------------------------------------------

    def _cgroup(self, pid: int, now: float) -> cg.CgroupOwner | None:
        if not self._read_proc:
            return None
        cached = self._cgroups.get(pid)
        if cached is not None and (now - cached[0] < CGROUP_RECHECK_SECONDS or self._rereads <= 0):
            return cached[1]  # fresh, or due but this resolve's re-reads are spent: a later poll re-reads it
        if cached is not None:
            self._rereads -= 1
        owner: cg.CgroupOwner | None
        try:
            owner, reason = cg.read_checked(self.config.proc_root, pid), ""
        except OSError as e:
            owner, reason = None, e.strerror or type(e).__name__
        if owner is None and pid not in self._cgroup_failed:
            self._cgroup_failed.add(pid)
            # Counted once per pid, not per poll: the usual cause is a daemon outside the host's PID namespace.
            self.errors["cgroup"] += 1
            if not self._failing["cgroup"]:
                self._failing["cgroup"] = True
                log.warning("cannot read %s/%d/cgroup of a GPU process (%s): its container is unknown (in a "
                            "container, gpuwatchd needs the host's PID namespace: hostPID)",
                            self.config.proc_root, pid, reason)
        elif owner is not None:
            self._cgroup_failed.discard(pid)  # readable again (a re-read after CGROUP_RECHECK_SECONDS)
        self._cgroups[pid] = (now, owner)
        return owner

    def _container_meta(self, owner: cg.CgroupOwner) -> ContainerMeta | None:
        cid = owner.container_id
        if cid is None:
            return None
        if cid in self._meta:
            return self._meta[cid]
        if len(self._meta) >= MAX_META_CACHE:
            self._meta.clear()
        meta, problem = read_meta(self.config.host_root, owner.runtime, cid)
        if problem is not None:
            # Once per container (the answer is cached): a FIFO, a huge or a malformed state file is "not known".
            self.errors["runtime"] += 1
            if not self._failing["runtime"]:  # said once: each container's file is read once anyway
                self._failing["runtime"] = True
                log.warning("container runtime file unusable, the container's name and pod are unknown (counted "
                            "in gpuwatchd_attribution_errors_total{source=\"runtime\"}): %s", problem)
        self._meta[cid] = meta
        return meta

    def resolve(self, snap: Snapshot, now: float | None = None) -> Attribution:
        """The owners of every process in the snapshot (plus the last kubelet answer and the error counts)."""
        now = time.monotonic() if now is None else now
        layout = [(g.uuid, g.index, g.parent_uuid, [p.pid for p in g.processes]) for g in snap.gpus]
        last = self._last
        same = last is not None and last[0] == self._inputs and last[1] == layout
        if last is not None and same and now < self._recheck_at:
            return Attribution(timestamp=snap.timestamp, owners=last[2], pods=self.pods, errors=dict(self.errors))
        self._rereads = max(CGROUP_REREADS_MIN, len(self._cgroups) // 10)
        if last is not None and same:
            # The same pids and answers, and re-reads due: the owners change only if a re-read finds another
            # cgroup. At 16 x 256 the re-reads are spread over polls (CGROUP_REREADS_MIN), so this is most polls:
            # the re-reads alone instead of every process' owner again (~4 ms a poll there).
            if not self._reread_due(snap, now):
                if not self._cgroup_failed:
                    self._failing["cgroup"] = False
                self._recheck_at = min((c[0] for c in self._cgroups.values()), default=now) + CGROUP_RECHECK_SECONDS
                return Attribution(timestamp=snap.timestamp, owners=last[2], pods=self.pods, errors=dict(self.errors))
            self._rereads = 0  # done: the owners are made again from what was read, as a resolve would have
        owners: dict[tuple[str, int], ProcessOwner] = {}
        index_by_uuid = {g.uuid: g.index for g in snap.gpus}
        self._pod_of_learned = False
        pids: set[int] = set()
        for g in snap.gpus:
            for p in g.processes:
                pids.add(p.pid)
                owner = self._owner(g, p.pid, now, index_by_uuid)
                if owner is not None:
                    owners[(g.uuid, p.pid)] = owner
        for gone in [pid for pid in self._cgroups if pid not in pids]:
            del self._cgroups[gone]
        self._cgroup_failed &= pids
        if not self._cgroup_failed:  # the streak ends when no listed process' cgroup is unreadable
            self._failing["cgroup"] = False
        live = {o.container_id for o in (c[1] for c in self._cgroups.values()) if o is not None and o.container_id}
        for cid in [cid for cid in self._pod_of if cid not in live]:
            del self._pod_of[cid]
        if last is not None and owners == last[2]:
            owners = last[2]  # the same object: the /metrics collector reuses the per-process families while it is
        # Owners made while _pod_of was still learning may lack a pod a later process taught it: not reused as they
        # are (the fast path would keep them), made again at the next resolve.
        self._last = (self._inputs, layout, owners) if not self._pod_of_learned else None
        self._recheck_at = min((c[0] for c in self._cgroups.values()), default=now) + CGROUP_RECHECK_SECONDS
        return Attribution(timestamp=snap.timestamp, owners=owners, pods=self.pods, errors=dict(self.errors))

    def _reread_due(self, snap: Snapshot, now: float) -> bool:
        """Re-read the due cgroups of ``snap``'s processes as :meth:`resolve` would (in its order, within this
        resolve's re-reads); True when one of them found another owner than the cached one."""
        if not self._read_proc:
            return False
        cgroups = self._cgroups
        changed = False
        for g in snap.gpus:
            for p in g.processes:
                if self._rereads <= 0:
                    return changed
                cached = cgroups.get(p.pid)
                if cached is None:
                    self._cgroup(p.pid, now)
                    changed = True
                elif now - cached[0] >= CGROUP_RECHECK_SECONDS and self._cgroup(p.pid, now) != cached[1]:
                    changed = True
        return changed

    def _owner(self, g: GpuSample, pid: int, now: float, index_by_uuid: dict[str, int]) -> ProcessOwner | None:
        c = self._cgroup(pid, now)
        if c is None:
            return None
        meta = self._container_meta(c)
        namespace = pod = container = None
        if meta is not None and meta.pod and meta.namespace:
            namespace, pod, container = meta.namespace, meta.pod, meta.container
        elif c.pod_uid is not None:
            cands = self._pods_by_uuid.get(g.uuid) or (
                self._pods_by_uuid.get(g.parent_uuid, []) if g.parent_uuid else [])
            if len({(x.namespace, x.pod, x.container) for x in cands}) == 1:
                namespace, pod, container = cands[0].namespace, cands[0].pod, cands[0].container
        if c.container_id is not None:
            if pod is not None and namespace is not None:
                known = (namespace, pod, container or "")
                if self._pod_of.get(c.container_id) != known:
                    self._pod_of[c.container_id] = known
                    self._pod_of_learned = True
            elif c.container_id in self._pod_of:
                namespace, pod, container = self._pod_of[c.container_id]
                container = container or None
        job = c.hpc_job
        if job is None and c.container_id is None and c.pod_uid is None and self.jobs:
            index = index_by_uuid.get(g.parent_uuid, g.index) if g.parent_uuid else g.index
            jobs = self.jobs.get(index)
            if jobs:
                job = job_label(jobs)
        if c.container_id is None and pod is None and job is None:
            return None
        return ProcessOwner(
            container_id=c.short_id, runtime=c.runtime,
            name=meta.name if meta is not None and meta.name != container else None,
            image=meta.image if meta is not None else None,
            namespace=namespace, pod=pod, container=container, hpc_job=job,
        )


def socket_explicit(fields_set: Collection[str]) -> bool:
    """Whether the config file named the socket (then a missing socket is an error, not "no Kubernetes")."""
    return "pod_resources_socket" in fields_set

