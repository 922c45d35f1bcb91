"""The worker's stand-in for ``ctypes.util`` (issue 20): pynvml imports ``find_library`` and never calls it, so the
real module (with shutil, tempfile, bz2, lzma) is loaded only if something does. Each case runs in a fresh
interpreter: the test process has long loaded the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gpuwatchd.sources.nvml.worker_process import child_env

# Installs the stand-in the way the worker does (importing the worker package), imports the real pynvml.
PRELUDE = """
import json, sys
import gpuwatchd.sources.nvml.worker
from gpuwatchd.sources.nvml.worker import lazy_ctypes_util as stand_in
import pynvml
heavy = ("shutil", "tempfile", "bz2", "lzma")
def loaded(): return sorted(m for m in ("ctypes.util", *heavy) if m in sys.modules and sys.modules[m] is not stand_in)
out = {"after_pynvml": loaded(), "pynvml_has_stand_in": pynvml.find_library is stand_in.find_library}
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


def test_pynvml_imports_without_loading_the_real_ctypes_util() -> None:
    out = _run("import ctypes; out['ctypes_util_attr'] = ctypes.util is stand_in")
    assert out == {"after_pynvml": [], "pynvml_has_stand_in": True, "ctypes_util_attr": True}


def test_find_library_loads_the_real_module_and_answers_as_it_does() -> None:
    out = _run("""
got = pynvml.find_library("c")  # the name pynvml imported, called as pynvml would call it
import ctypes, ctypes.util
out["got"] = got
out["real"] = ctypes.util.find_library("c")
out["replaced"] = sys.modules["ctypes.util"] is not stand_in and ctypes.util is sys.modules["ctypes.util"]
out["missing"] = stand_in.find_library("surely-no-such-library-gpuwatchd")
out["after_call"] = loaded()
""")
    assert out["got"] == out["real"] and isinstance(out["got"], str) and out["got"].startswith("libc.so")
    assert out["replaced"] is True and out["missing"] is None
    assert "ctypes.util" in out["after_call"]  # type: ignore[operator]


def test_other_attributes_come_from_the_real_module_and_dunders_do_not_load_it() -> None:
    out = _run("""
out["no_path"] = hasattr(stand_in, "__path__")
out["before"] = loaded()
import ctypes.util as via_import  # what `import ctypes.util` gives while the stand-in is in place
out["via_import"] = via_import is stand_in
out["gcc_is_real"] = via_import._findLib_gcc.__module__  # a private helper, through the stand-in's __getattr__
out["after"] = loaded()
""")
    assert (out["no_path"], out["before"], out["via_import"]) == (False, [], True)
    assert out["gcc_is_real"] == "ctypes.util" and "ctypes.util" in out["after"]  # type: ignore[operator]


def test_install_leaves_a_loaded_ctypes_util_alone() -> None:
    code = ("import ctypes.util, sys; from gpuwatchd.sources.nvml.worker import lazy_ctypes_util as s; "
            "real = sys.modules['ctypes.util']; print(s.install(), sys.modules['ctypes.util'] is real)")
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]
