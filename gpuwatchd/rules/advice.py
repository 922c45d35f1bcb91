"""What to do about a fault: the one advice text that chat, the status page, ``gpuwatchd status``, ``status --watch``
and ``/api/v1/status`` all show (issue 28 §2: one fault had three contradicting advices on three surfaces).

Every alert carries its advice in the ``action`` annotation, made here from the alert's kind (or the Xid catalog
entry) and the evidence the rule holds: whether the GPU sits behind a Thunderbolt dock, whether that dock is still
attached, whether the GPU was re-attached since an Xid, the dock's security level, the GPU's index. Rules pass the
evidence; a rule without evidence-dependent advice gets its alertname's text (``BY_ALERT``) when it fires. Everything
else that shows advice reads it from an alert (``of``, ``speaking``) or calls the same function with the same
evidence (an Xid no alert covers any more, a dock's panel): nothing re-derives it in other words, and no surface
shows a raw catalog code (``RESTART_BM``) as advice. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuwatchd.gpu import xid_catalog
from gpuwatchd.gpu.health import INCIDENT_ALERTS
from gpuwatchd.model import Alert
from gpuwatchd.model.health import ADVICE

ACTION = ADVICE  # the annotation holding an alert's advice (Alertmanager templates read it too)

# INCIDENT_ALERTS: the alerts that speak for everything else about their GPU while they fire (the default
# inhibition, docs/alerts.md "One incident, one message"): the loss or removal is the fault; an Xid 79 or a
# throttle on a gone GPU follows from it. The health assessment (gpu/health.py) holds the list.

# --- presence (rules/presence.py) --------------------------------------------------------------------------------
REPLUG_DOCK = ("Re-plug the dock (and check the enclosure is switched on); the GPU comes back under the same UUID, "
               "no reboot needed.")
LOST_DOCKED = ("Check the Thunderbolt cable (a certified 40 Gb/s one, seated at both ends) and the enclosure's power "
               "supply, then re-plug the dock; reboot if the GPU does not come back.")
LOST = ("Reboot the machine to recover the GPU; if it recurs, check the PCIe slot or riser, the power cables and "
        "PSU, and the GPU's temperature history.")
REMOVED = ("If that was not intended, look at the kernel log (Xid 79, PCIe AER errors) and lspci, and re-attach or "
           "rescan the device; it comes back under the same UUID.")
COUNT_LOW = ("Check the lost or removed GPUs, the kernel log (Xid 79, PCIe AER errors) and lspci; a reboot usually "
             "brings back a GPU that fell off the bus.")
BACK = "Nothing for the GPU; check that its jobs restarted."

# --- Xids (rules/xid.py): gpuwatchd's own words for the common codes, NVIDIA's catalog for the others -------------
_RESTART_APP = "Restart the application that hit it; the GPU itself is fine. Repeats point to a bug in the job."
_RESET_GPU = ("Reset the GPU (stop its processes, then nvidia-smi -r -i <index>) or reboot; contact support if it "
              "repeats.")
_EGPU_LINK = ("Check the Thunderbolt/OCuLink cable and the enclosure's power supply, then re-plug the dock; reboot "
              "if the GPU does not come back.")
XID_ACTION: dict[int, str] = {
    8: _RESTART_APP,
    13: _RESTART_APP,
    31: _RESTART_APP,
    32: _RESTART_APP,
    43: _RESTART_APP,
    45: "Nothing if a job was just stopped; otherwise follow the other Xid logged with it.",
    48: "<ECC_DBE>",  # the double-bit error GpuEccError reports: the same advice (set below)
    54: "Check the GPU's auxiliary power cables.",
    62: _RESET_GPU,
    63: "No action now; the remap takes effect at the next GPU reset. Watch GpuEccError for pending remaps.",
    64: _RESET_GPU,
    68: _RESTART_APP,
    74: "Reset the GPUs on the link or reboot; contact support if it repeats.",
    79: ("Reboot the machine to recover the GPU; if it recurs, check the PCIe slot or riser and the power cables "
         "and PSU."),
    92: "No action now; watch for ECC alerts.",
    94: "Restart the affected application; reset the GPU when convenient.",
    95: "Reset the GPU before restarting the applications on it.",
    109: _RESET_GPU,
    119: _RESET_GPU + " Power-cycle if it persists.",
    120: _RESET_GPU + " Power-cycle if it persists.",
    140: _RESET_GPU,
    143: _RESET_GPU,
    154: "Read the kernel log line for the new recovery action (drain, reset or reboot) and follow it.",
}
# On a GPU behind a Thunderbolt dock these point at the link or the enclosure first (PCIe signal quality, power).
XID_EGPU_ACTION: dict[int, str] = {
    32: _RESTART_APP + " On an eGPU repeats mean a marginal link: try another Thunderbolt cable or port.",
    54: "Check the enclosure's power supply and the GPU's power cables inside it.",
    79: _EGPU_LINK,
}
XID_REATTACHED = "Nothing for the GPU: it was re-attached or reset since; check that its jobs restarted."
XID_UNKNOWN = ("Look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors) and check the kernel log "
               "around it.")

# --- Thunderbolt docks (rules/dock.py) ---------------------------------------------------------------------------
NO_PCIE_LEVELS = ("dponly", "usbonly")  # security levels at which no PCIe tunnel is ever made
DOCK_LINK = ("Use a certified 40 Gb/s cable (passive cables longer than 0.8 m run at 20 Gb/s), plug it directly into "
             "a Thunderbolt port of the host (not a hub or a USB-C-only port), then re-plug the dock.")

# --- PCIe (rules/link.py) ----------------------------------------------------------------------------------------
LINK_DEGRADED = ("Reseat the card or riser and check the slot's lane setting in the BIOS and the slot itself.")
LINK_DEGRADED_EGPU = ("The Thunderbolt tunnel caps the link near Gen3 x4: if it trained lower, try another certified "
                      "cable and plug the dock directly into a Thunderbolt port of the host.")
REPLAYS = "Reseat the card or riser and the cables, and check the slot for dust; replace the riser if it persists."
REPLAYS_EGPU = ("Replace the Thunderbolt cable (a certified 40 Gb/s one, seated at both ends) or try another port on "
                "the host.")

# --- The rest: one advice per alertname, whatever the evidence ---------------------------------------------------
ECC_RESET = "Drain the GPU (let jobs finish or move them), then reset it (nvidia-smi -r -i <index>) or reboot."
ECC_DBE = "Data on this GPU may be corrupt: stop its jobs. " + ECC_RESET + " If DBEs recur, the board needs RMA."
XID_ACTION[48] = ECC_DBE
BY_ALERT: dict[str, str] = {
    "GpuTemperatureHigh": ("Check fans and airflow, ambient temperature, dust on the heatsink and neighbouring hot "
                           "cards; lower the power limit if it persists."),
    "GpuNvlinkErrors": ("Check nvidia-smi nvlink -e -i <index> and the peer on the same link; drain the GPU and reseat "
                        "or service the link if the count keeps rising."),
    "GpuProbeFailed": ("Drain the GPU (stop scheduling jobs on it), then run dcgmi diag -r 3 or the vendor's field "
                       "diagnostics; a GPU that fails again is an RMA case. gpuwatchd probe --gpu <index> re-runs "
                       "the probes now."),
    "GpuPerformanceDegraded": ("Look for thermal or power throttling, a degraded PCIe link (reseat the card or riser; "
                               "on an eGPU, the cable, the port, displays sharing the Thunderbolt tunnel), clocks "
                               "locked low, or another host load; gpuwatchd probe --gpu <index> shows measured, "
                               "baseline and expected figures."),
    "GpuMemoryHeldByDeadProcess": ("Find what keeps the CUDA context alive (fuser -v /dev/nvidia* lists every holder; "
                                   "a zombie goes when its parent reaps it or exits); if nothing holds the device, "
                                   "drain the GPU and reset it (nvidia-smi --gpu-reset -i <index>), or reboot."),
    "GpuUnderutilized": ("Feed the job faster (more data-loader workers, pinned memory, prefetching) or release the "
                         "GPU: a forgotten notebook or an idle inference server holding a model should let go."),
    "GpuXidRepeated": ("Drain the GPU and run diagnostics (dcgmi diag -r 3, or NVIDIA's field diagnostics); reseat or "
                       "replace the card if they fail."),
    "GpuXidSupportCase": ("Open a support case with the hardware vendor or NVIDIA (attach nvidia-bug-report.sh's "
                          "output and the kernel log of each episode) and drain the GPU until then."),
    "GpuCountLow": COUNT_LOW,
    "GpuwatchdRuleFailing": "Read the daemon log for the traceback and report it; restart the daemon to retry.",
}
LEAK: dict[str, str] = {
    "gpu": ("Check for tensors kept across iterations (losses or outputs appended without .detach()/.item(), growing "
            "caches, retained graphs), then restart the job; torch.cuda.memory_summary() shows what holds the "
            "memory."),
    "unattributed": ("Compare nvidia-smi with the process list; if it keeps rising after the jobs end, reset the "
                     "GPU."),
    "host_rss": "Restart the job and check its host-side buffers (pin_memory, cudaHostAlloc, DataLoader workers).",
}
THROTTLE: dict[str, str] = {
    "hw_slowdown": ("Check cooling (fans, airflow, dust, ambient temperature) and the power cables and PSU; on an "
                    "eGPU check the enclosure's PSU rating."),
    "hw_thermal": "Check fans, airflow and ambient temperature; reseat or clean the heatsink if it persists.",
    "sw_thermal": "Improve cooling or lower the load.",
    "hw_power_brake": "Check the PSU capacity and power cables; on servers check the BMC's power capping.",
    "sw_power_cap": ("Expected under full load: raise the power limit (nvidia-smi -pl) if the board allows it, or "
                     "accept the clocks."),
}


def _at(text: str, index: str | int | None) -> str:
    return text.replace("<index>", str(index)) if index not in (None, "") else text


def xid(code: int, *, egpu: bool = False, reattached: bool = False, index: str | int | None = None) -> str:
    """An Xid's advice: gpuwatchd's words for the code (the eGPU variant behind a dock), else NVIDIA's catalog
    buckets in words, else where to look it up; nothing to do once the GPU was re-attached or reset since."""
    if reattached:
        return XID_REATTACHED
    words = (XID_EGPU_ACTION.get(code) if egpu else None) or XID_ACTION.get(code)
    if words is not None:
        return _at(words, index)
    e = xid_catalog.entry(code)
    if e is None:
        return XID_UNKNOWN
    todo = xid_catalog.bucket_text(e.immediate_action) or XID_UNKNOWN
    text = todo[0].upper() + todo[1:] + ("" if todo.endswith(".") else ".")
    if e.investigatory_action and e.investigatory_action != e.immediate_action:
        again = xid_catalog.bucket_text(e.investigatory_action)
        if again:
            text += f" If it recurs: {again}."
    return _at(text, index)


def dock_unauthorized(unique_id: str, security: str | None) -> str:
    """What lets the GPU behind an unauthorized dock in, for the dock's security level as sysfs reports it."""
    enroll = (f"Authorize the dock: boltctl enroll {unique_id} (remembered; boltctl authorize {unique_id} for this "
              "time only; boltctl list shows it).")
    if security in NO_PCIE_LEVELS:
        return (f"Set the Thunderbolt security level in the BIOS/UEFI to 'user' (it is '{security}', which never makes "
                f"a PCIe tunnel), then: boltctl enroll {unique_id}.")
    if security == "secure":
        return enroll + " At 'secure' the dock's key is checked too: enroll it once while it is trusted."
    if security == "none":
        return (f"The security level is 'none' yet the dock is not authorized: re-plug it, and if it stays so, "
                f"boltctl enroll {unique_id}.")
    return enroll


def link_degraded(*, egpu: bool) -> str:
    return LINK_DEGRADED_EGPU if egpu else LINK_DEGRADED


def pcie_replays(*, egpu: bool) -> str:
    return REPLAYS_EGPU if egpu else REPLAYS


def by_alert(name: str, index: str | int | None = None) -> str | None:
    """The advice of an alert whose advice does not depend on evidence; None for one whose rule supplies it."""
    text = BY_ALERT.get(name)
    return _at(text, index) if text is not None else None


def of(alert: Alert) -> str:
    """The advice an alert carries ("" for one from a daemon or rule that gave none)."""
    return alert.annotations.get(ACTION, "")


def speaking(alerts: Iterable[Alert], uuid: str) -> Alert | None:
    """The firing alert that speaks for a GPU's incident: its loss or removal, which every other alert about the GPU
    follows from; None when the GPU has neither."""
    for a in alerts:
        if a.state == "firing" and a.name in INCIDENT_ALERTS and a.labels.get("uuid") == uuid:
            return a
    return None


def for_xid(alerts: Iterable[Alert], uuid: str | None, code: int, *, egpu: bool, reattached: bool,
            index: str | int | None) -> str:
    """The advice shown beside an Xid on the page, in ``status`` and in ``/api/v1/status``: the advice of the alert
    that speaks for it now (the GPU's loss or removal, else its ``GpuXidError``), else the Xid's own for the evidence
    now. The same text chat carried for it."""
    alerts = list(alerts)
    if uuid is not None:
        incident = speaking(alerts, uuid)
        if incident is not None and of(incident):
            return of(incident)
        for a in alerts:
            if (a.name == "GpuXidError" and a.state in ("pending", "firing") and a.labels.get("uuid") == uuid
                    and a.labels.get("xid") == str(code) and of(a)):
                return of(a)
    return xid(code, egpu=egpu, reattached=reattached, index=index)


def for_dock(alerts: Iterable[Alert], unique_id: str, security: str | None) -> str:
    """The advice beside an unauthorized dock: its ``GpuDockUnauthorized``'s, else the same words for its level."""
    for a in alerts:
        if (a.name == "GpuDockUnauthorized" and a.state != "resolved" and a.labels.get("unique_id") == unique_id
                and of(a)):
            return of(a)
    return dock_unauthorized(unique_id, security)


def annotate(name: str, annotations: Mapping[str, str], index: str | int | None) -> dict[str, str] | None:
    """``annotations`` with the alertname's advice added, or None when it has one already or its rule gives it."""
    if ACTION in annotations:
        return None
    text = by_alert(name, index)
    return None if text is None else {**annotations, ACTION: text}
