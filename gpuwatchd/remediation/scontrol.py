"""Slurm through its own command, ``scontrol`` (no home-made Slurm client): read a node's state and reason, drain
it, resume it. Errors are values: every call returns what happened, never raises for Slurm's faults."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MAX_OUTPUT = 256 * 1024  # `scontrol show node` of one node is a few hundred bytes
REAP_TIMEOUT_S = 5.0
# `Reason=... [user@2026-11-28T14:46:56]`: Slurm appends who set the reason and when.
_SET_BY = re.compile(r"\s*\[([^\[\]@]*)@([^\[\]]*)\]\s*$")

Failure = Literal["missing", "timeout", "failed", "no_node"]


@dataclass(frozen=True, slots=True)
class CallResult:
    ok: bool
    output: str
    failure: Failure | None = None  # why not ok
    message: str = ""  # in words, for the log


@dataclass(frozen=True, slots=True)
class NodeState:
    """What ``scontrol show node NODE`` says about one node."""

    name: str
    state: str  # IDLE+DRAIN, MIXED, DOWN+DRAIN ...
    reason: str | None  # without Slurm's "[user@time]" suffix
    reason_user: str | None
    reason_time: str | None

    @property
    def drained(self) -> bool:
        """DRAIN, DRAINING or DRAINED (and DOWN, which takes no jobs either): a drain of ours would add nothing."""
        flags = set(re.split(r"[+*~#!%$@^-]", self.state.upper()))
        return bool(flags & {"DRAIN", "DRAINING", "DRAINED", "DOWN", "FAIL", "FAILING"})


def parse_node(text: str, name: str) -> NodeState | None:
    """The node ``name`` in ``scontrol show node`` output (one or several nodes, multi-line or ``-o``)."""
    for block in re.split(r"\n\s*\n", text.strip()):
        if not block.startswith(f"NodeName={name} ") and block.strip() != f"NodeName={name}":
            continue
        state = ""
        reason: str | None = None
        for raw in block.splitlines():
            line = raw.strip()
            m = re.search(r"(?:^|\s)State=(\S+)", line)
            if m and not state:
                state = m.group(1)
            if line.startswith("Reason="):
                reason = line[len("Reason="):]
        if reason is None:  # one-line form (-o): the reason runs to the next key=value
            m = re.search(r"(?:^|\s)Reason=(.*?)(?=\s+[A-Za-z]+=|$)", block)
            reason = m.group(1) if m else None
        user = at = None
        if reason is not None:
            sm = _SET_BY.search(reason)
            if sm:
                user, at = sm.group(1), sm.group(2)
                reason = reason[:sm.start()]
            reason = reason.strip() or None
            if reason == "(null)":
                reason = None
        return NodeState(name, state, reason, user, at)
    return None


class Scontrol:
    """Runs ``scontrol`` for one node."""

    def __init__(self, command: Path, slurm_conf: Path | None, timeout: float,
                 env: Mapping[str, str] | None = None) -> None:
        self.command = str(command)
        self.timeout = timeout
        self.env = dict(os.environ if env is None else env)
        if slurm_conf is not None:
            self.env["SLURM_CONF"] = str(slurm_conf)

    async def run(self, *args: str) -> CallResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                self.command, *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env=self.env, start_new_session=True,
            )
        except FileNotFoundError:
            return CallResult(False, "", "missing", f"{self.command}: not found (is Slurm installed here?)")
        except OSError as e:
            return CallResult(False, "", "missing", f"{self.command}: cannot run it ({e.strerror or e})")
        assert proc.stdout is not None
        try:
            out = await asyncio.wait_for(_read_all(proc.stdout), self.timeout)
            rc = await asyncio.wait_for(proc.wait(), self.timeout)
        except asyncio.TimeoutError:
            _kill(proc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), REAP_TIMEOUT_S)
            return CallResult(False, "", "timeout", f"scontrol {args[0]} did not answer within {self.timeout:g} s")
        except BaseException:
            _kill(proc)
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(proc.wait(), REAP_TIMEOUT_S)
            raise
        text = out.decode("utf-8", "replace").strip()
        if rc != 0:
            failure: Failure = "no_node" if "not found" in text.lower() else "failed"
            return CallResult(False, text, failure, f"scontrol {' '.join(args[:2])} exited {rc}: {text[-300:]}")
        return CallResult(True, text)

    async def show(self, node: str) -> tuple[NodeState | None, CallResult]:
        res = await self.run("show", "node", node)
        if not res.ok:
            return None, res
        state = parse_node(res.output, node)
        if state is None:
            return None, CallResult(False, res.output, "no_node", f"scontrol show node {node}: no such node in "
                                    "its output")
        return state, res

    async def drain(self, node: str, reason: str) -> CallResult:
        return await self.run("update", f"nodename={node}", "state=drain", f"reason={reason}")

    async def resume(self, node: str) -> CallResult:
        return await self.run("update", f"nodename={node}", "state=resume")


async def _read_all(stream: asyncio.StreamReader) -> bytes:
    kept = bytearray()
    while chunk := await stream.read(65536):
        kept += chunk[: max(0, MAX_OUTPUT - len(kept))]
    return bytes(kept)


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
