"""A real one-node Slurm cluster on loopback for the remediation tests: munged with its own key and socket,
slurmctld and slurmd (Debian's slurm-wlm) with a slurm.conf in a temporary directory, ports chosen free."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from support import free_port, wait_until

NODE = "gwnode"
BINARIES = ("munged", "slurmctld", "slurmd", "scontrol")


def missing_binaries() -> list[str]:
    extra = ("/usr/sbin", "/sbin")
    path = os.pathsep.join([os.environ.get("PATH", ""), *extra])
    return [b for b in BINARIES if shutil.which(b, path=path) is None]


def _which(name: str) -> str:
    found = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    assert found is not None
    return found


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def scontrol(self, *args: str) -> str:
        out = subprocess.run([_which("scontrol"), *args], env=self.env, capture_output=True, text=True, timeout=60,
                             check=True)
        return out.stdout

    def node(self) -> dict[str, str]:
        """State and Reason of the node, from `scontrol show node` (the reason with Slurm's [user@time])."""
        out: dict[str, str] = {}
        for raw in self.scontrol("show", "node", NODE).splitlines():
            line = raw.strip()
            if line.startswith("Reason="):
                out["Reason"] = line[len("Reason="):]
            for word in line.split():
                if word.startswith("State="):
                    out["State"] = word[len("State="):]
        return out

    def log(self) -> str:
        texts = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            p = self.root / name
            if p.exists():
                texts.append(f"--- {name}\n" + p.read_text(errors="replace")[-3000:])
        return "\n".join(texts)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> SlurmCluster:
    # A short path: munge's socket must fit in sun_path (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="gw-slurm-"))
    root.chmod(0o755)
    for d in ("munge", "state", "spool"):
        (root / d).mkdir()
    (root / "munge").chmod(0o755)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = root / "munge" / "munge.sock"
    host = socket.gethostname().split(".", 1)[0]
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=gpuwatchdtest",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", f"AuthInfo=socket={sock}", "CredType=cred/munge",
        "MailProg=/bin/true",
        f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}", f"SlurmdLogFile={root / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "SwitchType=switch/none", "MpiDefault=none",
        "ReturnToService=2", "DebugFlags=NO_CONF_HASH",
        f"NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=1 State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ]))
    cluster = SlurmCluster(root, conf)
    devnull = subprocess.DEVNULL
    try:
        cluster.procs.append(subprocess.Popen(
            [_which("munged"), "-F", "-f", f"--socket={sock}", f"--key-file={key}",
             f"--log-file={root / 'munged.log'}", f"--pid-file={root / 'munge' / 'munged.pid'}",
             f"--seed-file={root / 'munge' / 'seed'}"], stdout=devnull, stderr=devnull))
        wait_until(sock.exists, "munged's socket")
        cluster.procs.append(subprocess.Popen([_which("slurmctld"), "-D", "-i"], env=cluster.env, stdout=devnull,
                                              stderr=devnull))
        cluster.procs.append(subprocess.Popen([_which("slurmd"), "-D", "-N", NODE], env=cluster.env, stdout=devnull,
                                              stderr=devnull))

        def node_up() -> bool:
            for p in cluster.procs:
                assert p.poll() is None, f"{p.args[0]} exited with {p.returncode}:\n{cluster.log()}"
            try:
                state = cluster.node().get("State", "")
            except subprocess.CalledProcessError:
                return False
            return bool(state) and "NOT_RESPONDING" not in state and "UNKNOWN" not in state and "DOWN" not in state

        wait_until(node_up, "the Slurm node to register with slurmctld", timeout=90)
    except BaseException:
        cluster.stop()
        raise
    return cluster
