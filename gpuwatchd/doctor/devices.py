"""``/dev/nvidia*``: present, and readable and writable by the user the daemon runs as (NVML opens nvidiactl and
one nvidiaN per GPU read-write; CUDA needs nvidia-uvm too)."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from gpuwatchd.doctor.context import Host
from gpuwatchd.doctor.nvml_probe import NvmlFacts
from gpuwatchd.doctor.report import Result, fail, ok, warn

G = "devices"


def _ids(user: str) -> tuple[str, int, set[int]]:
    """(name, uid, gids) of ``user``, or of the current user when ``user`` does not exist on this host."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        uid = os.getuid()
        name = pwd.getpwuid(uid).pw_name if uid >= 0 else str(uid)
        return name, uid, set(os.getgroups()) | {os.getgid()}
    gids = {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    return user, pw.pw_uid, gids


def _rw(path: Path, uid: int, gids: set[int]) -> bool:
    st = path.stat()
    if uid == 0:
        return True
    if st.st_uid == uid:
        need = stat.S_IRUSR | stat.S_IWUSR
    elif st.st_gid in gids:
        need = stat.S_IRGRP | stat.S_IWGRP
    else:
        need = stat.S_IROTH | stat.S_IWOTH
    return st.st_mode & need == need


def check_devices(host: Host, nvml: NvmlFacts) -> list[Result]:
    count = int(nvml.system.get("count") or 0)
    names = ["nvidiactl", *(f"nvidia{i}" for i in range(count)), "nvidia-uvm"]
    user, uid, gids = _ids(host.service_user)
    missing = [n for n in names if not host.path(f"/dev/{n}").exists()]
    out: list[Result] = []
    if missing:
        out.append(fail(
            G, "device nodes", f"missing: {', '.join('/dev/' + n for n in missing)}",
            "the nodes are made when the driver loads: `sudo nvidia-modprobe -c 0 -u` (or `sudo modprobe "
            "nvidia-uvm`); check `ls -l /dev/nvidia*` after",
        ))  # fmt: skip
    else:
        out.append(ok(G, "device nodes", f"{', '.join('/dev/' + n for n in names)} present"))
    denied = [n for n in names if n not in missing and not _rw(host.path(f"/dev/{n}"), uid, gids)]
    if denied:
        out.append(fail(
            G, "device access", f"user {user} cannot open {', '.join('/dev/' + n for n in denied)} read-write",
            f"add {user} to the group owning them (`sudo usermod -aG video {user}`; the unit's "
            "SupplementaryGroups=video does this for the service) or fix the driver's NVreg_DeviceFileMode/GID",
        ))  # fmt: skip
    elif not missing:
        out.append(ok(G, "device access", f"user {user} can open them read-write"))
    return out


def check_persistence(gpus: list[dict[str, object]]) -> list[Result]:
    off = [str(g["index"]) for g in gpus if g.get("persistence_mode") == 0]
    if off:
        return [warn(
            G, "persistence mode", f"off on GPU {', '.join(off)}: the driver tears the GPU down whenever no "
            "program holds it, so each start takes seconds and clocks/ECC state reset",
            "`sudo systemctl enable --now nvidia-persistenced` (or `sudo nvidia-smi -pm 1`)",
        )]  # fmt: skip
    known = [g for g in gpus if g.get("persistence_mode") is not None]
    if not known:
        return [ok(G, "persistence mode", "not reported by this driver")] if gpus else []
    return [ok(G, "persistence mode", "on")]
