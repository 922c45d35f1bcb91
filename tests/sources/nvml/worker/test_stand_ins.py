"""The worker's stand-ins (issue 20): ``ctypes.util``, which pynvml imports and never calls, and ``subprocess``,
``datetime``, ``base64`` and ``glob``, which psutil imports and uses only in calls the worker does not make, are
loaded only if something uses them, and then answer as the real modules. Each case runs in a fresh ``python -S``
like the worker's: the test process has long loaded the real modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gpuwatchd.sources.nvml.worker_process import child_env

# Installs the stand-ins the way the worker does (importing the worker package), imports the real pynvml and psutil.
PRELUDE = """
import json, os, sys
import gpuwatchd.sources.nvml.worker
from gpuwatchd.sources.nvml.worker import stand_ins
import pynvml, psutil
def loaded():
    return sorted(m for m in (*stand_ins.WORKER_STAND_INS, "shutil", "tempfile", "bz2", "lzma", "locale", "binascii",
                              "fnmatch") if m in sys.modules and not isinstance(sys.modules[m], stand_ins.StandIn))
out = {"after_import": loaded()}
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a ``python -S`` like the worker's, with the import path the daemon hands it."""
    return subprocess.run([sys.executable, "-S", "-c", code], env=child_env(os.environ, None), capture_output=True,
                          text=True, timeout=60, check=False)


def _run(code: str) -> dict[str, object]:
    r = _python(PRELUDE + code + "\nprint(json.dumps(out))")
    assert r.returncode == 0, r.stderr
    result: dict[str, object] = json.loads(r.stdout)
    return result


def test_pynvml_psutil_and_the_workers_own_psutil_calls_leave_them_unloaded() -> None:
    out = _run("""
import ctypes
from gpuwatchd.sources.nvml.worker.processes import ProcResolver
resolver = ProcResolver()
me = os.getpid()
out["resolved"] = resolver.resolve([me])[me][0] is not None and resolver.states([me])[me][0] == "live"
out["after_calls"] = loaded()
out["pynvml_find_library"] = pynvml.find_library is sys.modules["ctypes.util"].find_library
out["on_package"] = ctypes.util is sys.modules["ctypes.util"]
""")
    assert out == {"after_import": [], "resolved": True, "after_calls": [], "pynvml_find_library": True,
                   "on_package": True}


def test_find_library_loads_the_real_module_and_answers_as_it_does() -> None:
    out = _run("""
got = pynvml.find_library("c")  # the name pynvml imported, called as pynvml would call it
import ctypes, ctypes.util
out["got"], out["real"] = got, ctypes.util.find_library("c")
out["replaced"] = not isinstance(ctypes.util, stand_ins.StandIn) and ctypes.util is sys.modules["ctypes.util"]
out["missing"] = pynvml.find_library("surely-no-such-library-gpuwatchd")
out["after_call"] = loaded()
""")
    assert out["got"] == out["real"] and isinstance(out["got"], str) and out["got"].startswith("libc.so")
    assert out["replaced"] is True and out["missing"] is None
    assert {"bz2", "ctypes.util", "lzma", "shutil", "tempfile"} <= set(out["after_call"])  # type: ignore[call-overload]


def test_psutil_popen_and_a_process_repr_load_subprocess_and_datetime() -> None:
    out = _run("""
p = psutil.Popen([sys.executable, "-S", "-c", "import sys; sys.exit(3)"])
out["code"] = p.wait(timeout=30)
me = psutil.Process()
me.create_time()
out["repr"] = "started=" in repr(me)  # psutil formats a known start time with datetime
out["after"] = loaded()
import subprocess
out["real"] = subprocess.Popen.__module__ == "subprocess" and not isinstance(subprocess, stand_ins.StandIn)
""")
    assert (out["code"], out["repr"], out["real"]) == (3, True, True)
    assert out["after"] == ["datetime", "locale", "subprocess"]


def test_psutil_calls_that_need_base64_and_glob_load_them() -> None:
    out = _run("""
out["conns"] = isinstance(psutil.net_connections("tcp4"), list)  # addresses decoded with base64.b16decode
out["temps"] = isinstance(psutil.sensors_temperatures(), dict)  # /sys/class/hwmon found with glob.glob
out["after"] = loaded()
""")
    assert (out["conns"], out["temps"]) == (True, True)
    assert {"base64", "binascii", "glob", "fnmatch"} <= set(out["after"])  # type: ignore[call-overload]


def test_other_attributes_come_from_the_real_module_and_path_does_not_load_it() -> None:
    out = _run("""
import ctypes.util as via_import  # what `import ctypes.util` gives while the stand-in is in place
out["via_import"] = isinstance(via_import, stand_ins.StandIn)
out["no_path"] = hasattr(via_import, "__path__")
import importlib.util
out["spec"] = importlib.util.find_spec("datetime").origin.endswith("datetime.py")
out["before"] = loaded()
out["gcc"] = via_import._findLib_gcc.__module__  # a private helper, through the stand-in
out["dir"] = "find_library" in dir(sys.modules["subprocess"]) or "Popen" in dir(sys.modules["subprocess"])
out["after"] = loaded()
""")
    assert (out["via_import"], out["no_path"], out["spec"], out["before"]) == (True, False, True, [])
    assert out["gcc"] == "ctypes.util" and out["dir"] is True
    assert {"ctypes.util", "subprocess"} <= set(out["after"])  # type: ignore[call-overload]


def test_install_leaves_a_loaded_module_alone() -> None:
    r = _python("import ctypes.util, sys; from gpuwatchd.sources.nvml.worker import stand_ins as s; "
                "real = sys.modules['ctypes.util']; "
                "print(s.install('ctypes.util'), sys.modules['ctypes.util'] is real)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]
