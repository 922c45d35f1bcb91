"""A stand-in for ``ctypes.util`` in the NVML worker that loads the real module on first use.

pynvml (nvidia-ml-py 13.615.71, ``pynvml.py``) has at line 33::

    from ctypes.util import find_library

and calls ``find_library`` nowhere: its loader, ``_LoadNvmlLibrary``, opens ``CDLL("libnvidia-ml.so.1")`` on
Linux (``# assume linux``) and ``CDLL(<WINDIR or ProgramFiles>/.../nvml.dll)`` on Windows, by path in both cases.
Importing the real ``ctypes.util`` brings shutil, tempfile (with random, weakref, bisect, hashlib's sha512), bz2,
lzma and zlib, 0.5-0.8 MB of the worker's RSS (docs/performance.md, "Memory") for a name never called.

:func:`install` puts this module in ``sys.modules["ctypes.util"]`` (and as ``ctypes.util``) when the real one is
not loaded yet. Its :func:`find_library` and every other attribute (``__getattr__``) import the real module on
first use and hand over to it, and the real one then replaces the stand-in in ``sys.modules`` and on ``ctypes``:
whatever asks, whenever, gets what the real module would have given. pynvml itself stays the unmodified package.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
import threading

NAME = "ctypes.util"
_lock = threading.Lock()


def _real() -> object:
    """The real ``ctypes.util``, imported on first call (and put in place of this stand-in)."""
    with _lock:
        mod = sys.modules.get(NAME)
        if mod is None or mod is _this:
            sys.modules.pop(NAME, None)
            try:
                mod = importlib.import_module(NAME)  # sets sys.modules[NAME] and ctypes.util to the real module
            except BaseException:
                sys.modules.setdefault(NAME, _this)
                raise
        return mod


def find_library(name: str) -> str | None:
    """``ctypes.util.find_library``, from the real module."""
    found: str | None = getattr(_real(), "find_library")(name)  # noqa: B009 (the real module, typed as object)
    return found


def __getattr__(attr: str) -> object:
    """Any other attribute of ``ctypes.util`` (``_findLib_gcc``, ``os`` ...), from the real module.

    Dunder names are not handed over: the real module has no others than this one's own (``__name__``,
    ``__spec__``, ``__file__`` ...), and the import system asks for some that no module of this kind has
    (``from ctypes.util import find_library`` looks for ``__path__``), which must not load it."""
    if attr.startswith("__") and attr.endswith("__"):
        raise AttributeError(f"module {NAME!r} has no attribute {attr!r}")
    return getattr(_real(), attr)


def install() -> bool:
    """Stand in for ``ctypes.util`` until it is used; False (nothing done) when the real one is already loaded."""
    if NAME in sys.modules:
        return False
    sys.modules[NAME] = _this
    ctypes.util = _this  # type: ignore[attr-defined]  # as an import of a submodule sets it on its package
    return True


_this = sys.modules[__name__]
