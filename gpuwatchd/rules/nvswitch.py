"""``NvSwitchError``: an NVSwitch logged SXid errors (kernel log, ``nvidia-nvswitch``) recently; one alert per switch.

Critical when one of them was fatal (the line says ``Fatal``: NVLink traffic through the switch stalls, CUDA jobs
abort with Xid 45, and the GPUs and switches need a reset; NVIDIA Fabric Manager user guide), warning for non-fatal
ones. The alert holds while the switch logged within ``rules.nvswitch.window`` and resolves after a quiet window.
"""

from __future__ import annotations

from gpuwatchd.model import Severity
from gpuwatchd.rules.condition import Condition, RuleView
from gpuwatchd.rules.config import RulesConfig

NAME = "NvSwitchError"
DESCRIPTION = (
    "The NVSwitch logged SXid errors (`journalctl -k | grep SXid`). Fatal ones stall NVLink traffic through the "
    "switch: drain the node and reset the GPUs and switches (a reboot), then check `/var/log/fabricmanager.log`. "
    "Non-fatal ones that keep coming point at a marginal NVLink (the Link number in the line) or switch tray."
)
_SEVERITIES: tuple[Severity, ...] = ("warning", "critical")


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """One condition per switch that ever logged an SXid: raised while within the window, cleared after it."""
    stats = view.kernel_log
    if stats is None or not stats.sxid_last:
        return []
    window = config.nvswitch.window
    out: list[Condition] = []
    for switch, last in sorted(stats.sxid_last.items()):
        labels = {"switch": switch}
        codes = sorted(code for (s, code) in stats.sxid if s == switch)
        total = sum(n for (s, _), n in stats.sxid.items() if s == switch)
        fatal_at = stats.sxid_fatal_last.get(switch)
        if now - last > window and (fatal_at is None or now - fatal_at > window):
            for sev in _SEVERITIES:
                out.append(Condition(NAME, sev, labels, f"NVSwitch {switch}: no SXid error in the last "
                                     f"{window:g} s ({total} in all)", DESCRIPTION, level="clear"))
            continue
        fatal = fatal_at is not None and now - fatal_at <= window
        fatal_total = sum(n for (s, _), n in stats.sxid_fatal.items() if s == switch)
        out.append(Condition(
            NAME, "critical" if fatal else "warning", labels,
            f"NVSwitch {switch}: {total} SXid error(s) ({fatal_total} fatal), codes {', '.join(codes)}",
            DESCRIPTION, value=float(total),
        ))
    return out
