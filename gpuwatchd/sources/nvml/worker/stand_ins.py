"""Stand-ins, in the NVML worker, for standard-library modules its libraries import at start and it never uses.

Each is a module object in ``sys.modules`` (and on its package, as an import sets it) that imports the real module
on first use and hands over to it: any attribute but ``__path__`` (the import system asks every module for it, and
none of these is a package) loads the real module, which then takes the stand-in's place in ``sys.modules``. So
whatever asks, whenever, gets what the real module gives; until then its memory is not spent. pynvml and psutil
themselves are the unmodified packages. Measured in the spawned worker at 8x32 (docs/performance.md, "Memory"):

- ``ctypes.util`` (0.5-0.8 MB with shutil, tempfile, random, bz2, lzma and zlib): pynvml (nvidia-ml-py
  13.615.71, ``pynvml.py``) has ``from ctypes.util import find_library`` at line 33 and calls it nowhere. Its
  loader, ``_LoadNvmlLibrary``, opens ``CDLL("libnvidia-ml.so.1")`` on Linux (``# assume linux``) and
  ``CDLL(<WINDIR or ProgramFiles>/.../nvml.dll)`` on Windows, by path in both cases. Because pynvml takes the name
  at import, the stand-in holds a ``find_library`` that loads the real module when called and calls its own.
- ``subprocess`` and ``datetime`` (0.9 MB with locale, fcntl and _datetime), ``base64`` and ``glob`` (0.2 MB with
  binascii and fnmatch): psutil 7.2 imports them at start and uses them only in calls the worker never makes:
  ``subprocess`` in ``psutil.Popen`` (``__init__``, ``__dir__``, ``wait``), ``datetime`` in ``_pprint_secs`` (a
  ``Process``'s repr), ``base64`` in ``net_connections``' address parsing, ``glob`` in the sensors, CPU frequency
  and disk functions. The worker's own calls (``Process``, ``oneshot``, ``is_running``, ``status``,
  ``memory_info``, ``name``, ``username``) touch none of them. (``resource`` is not among them: psutil asks
  ``hasattr(resource, "prlimit")`` while defining its ``Process`` class.)

Why not the standard library's ``importlib.util.LazyLoader``: its module runs the real code at the first attribute
read of any kind, and ``from ctypes.util import find_library`` is such a read, made at pynvml's import; so
``ctypes.util`` needs a stand-in that already holds ``find_library`` (``_EAGER``). The four psutil modules would
work with ``LazyLoader``, but one mechanism for the five is less code than two.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Callable

# What the worker stands in for, and why: the module docstring.
WORKER_STAND_INS = ("ctypes.util", "subprocess", "datetime", "base64", "glob")

_lock = threading.Lock()


class StandIn(types.ModuleType):
    """``sys.modules[name]`` until the real module is needed; every attribute comes from the real one."""

    def __getattr__(self, attr: str) -> object:
        if attr == "__path__":
            raise AttributeError(f"module {self.__name__!r} has no attribute '__path__'")
        return getattr(real(self.__name__), attr)

    def __dir__(self) -> list[str]:
        return dir(real(self.__name__))


def real(name: str) -> types.ModuleType:
    """The real module ``name``: imported on the first call in place of its stand-in, found loaded after."""
    with _lock:  # one caller takes the stand-in out; the import itself runs unlocked (it may load another one)
        stand_in = sys.modules.get(name)
        if isinstance(stand_in, StandIn):
            del sys.modules[name]
    try:
        # sets sys.modules[name] and the package's attribute; a concurrent caller waits on the import's own lock
        return importlib.import_module(name)
    except BaseException:
        if isinstance(stand_in, StandIn):
            sys.modules.setdefault(name, stand_in)
        raise


def _find_library(name: str) -> str | None:
    """``ctypes.util.find_library``, from the real module."""
    find: Callable[[str], str | None] = real("ctypes.util").find_library
    return find(name)


# Names a library takes from the module at import (``from m import name``): each calls into the real module.
_EAGER: dict[str, dict[str, object]] = {"ctypes.util": {"find_library": _find_library}}


def install(name: str) -> bool:
    """Stand in for module ``name`` until it is used; False (nothing done) when it is loaded already."""
    if name in sys.modules:
        return False
    spec = importlib.util.find_spec(name)  # a path lookup; imports the parent package (ctypes for ctypes.util)
    if spec is None:
        return False
    stand_in = StandIn(name)
    # What the import system and importlib.util.find_spec read from a loaded module, as the real one has them.
    stand_in.__spec__, stand_in.__loader__, stand_in.__file__ = spec, spec.loader, spec.origin
    stand_in.__package__ = spec.parent
    vars(stand_in).update(_EAGER.get(name, {}))
    sys.modules[name] = stand_in
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, stand_in)  # as an import of a submodule sets it on its package
    return True


def install_all(names: tuple[str, ...] = WORKER_STAND_INS) -> list[str]:
    """:func:`install` each of ``names``; the ones now stood in for."""
    return [name for name in names if install(name)]

