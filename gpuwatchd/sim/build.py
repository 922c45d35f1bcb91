"""Build the stand-in ``libnvidia-ml.so.1`` on demand with the system C compiler, into a content-keyed cache.

The cache key is a hash of the C source, NVIDIA's ``nvml.h``, the compiler's identity, the flags and the omitted
symbols, so a changed source or header rebuilds and a variant without some symbols gets its own directory.
Builds go to a temporary directory that is renamed into place, so parallel test workers never see half a library.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from gpuwatchd.sim.state import STANDIN_SYMBOLS

SONAME = "libnvidia-ml.so.1"
SOURCE = Path(__file__).with_name("standin.c")  # the exported API; its helpers sit next to it
SOURCES = (SOURCE, SOURCE.with_name("standin_state.c"), SOURCE.with_name("standin_procutil.c"),
           SOURCE.with_name("standin_nvlink.c"), SOURCE.with_name("standin_fabric.c"),
           SOURCE.with_name("standin_gpm.c"),
           SOURCE.with_name("standin_mig.c"))
HEADERS = (SOURCE.with_name("standin.h"), SOURCE.with_name("standin_readings.def"))
# The header the stand-in is compiled against; pinned so struct layouts match the pynvml we ship with.
HEADER_PACKAGE = "nvidia-nvml-dev==13.5.37"
CFLAGS = (
    "-std=gnu11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wmissing-prototypes",  # every exported call must be one nvml.h declares (a misspelt symbol fails the build)
    "-O2",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    f"-Wl,-soname,{SONAME}",
    "-Wl,--no-undefined",  # a missing translation unit must fail the build, not the dlopen
)
LIBS = ("-lpthread",)
_COMPILE_TIMEOUT_S = 120  # a cold gcc on a loaded 2-core box takes a few seconds; this only catches a wedged one


class StandinBuildError(RuntimeError):
    """The stand-in driver could not be built (no compiler, no header, or a compile error)."""


def find_nvml_header() -> Path:
    """Path of ``nvml.h`` from the ``nvidia-nvml-dev`` wheel (``nvidia/cu*/include/nvml.h``)."""
    spec = importlib.util.find_spec("nvidia")  # namespace package installed by the NVIDIA wheels
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        for candidate in sorted(Path(root).glob("cu*/include/nvml.h"), reverse=True):
            return candidate
    raise StandinBuildError(
        f"nvml.h not found (looked in {roots or 'no nvidia package'}); install it with: pip install {HEADER_PACKAGE}"
    )


def _compiler() -> list[str]:
    cc = os.environ.get("CC")
    argv = shlex.split(cc) if cc else []
    if argv:
        exe = shutil.which(argv[0])
        if exe is None:
            raise StandinBuildError(
                f"no C compiler found: CC={cc!r} is not an executable (install gcc or set CC to a C compiler)"
            )
        return [exe, *argv[1:]]
    for name in ("cc", "gcc", "clang"):
        exe = shutil.which(name)
        if exe:
            return [exe]
    raise StandinBuildError("no C compiler found (install gcc or set CC); it builds the stand-in NVML driver")


def _compiler_identity(cc: list[str]) -> str:
    try:
        out = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError as exc:
        raise StandinBuildError(f"C compiler {cc[0]} cannot run: {exc} (install gcc or set CC)") from exc
    return out.stdout.splitlines()[0] if out.stdout else cc[0]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/gpuwatchd/standin``, falling back to ``~/.cache/gpuwatchd/standin``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuwatchd" / "standin"


def build_standin(omit: Iterable[str] = (), cache_dir: Path | None = None) -> Path:
    """Compile the stand-in (without the ``omit`` symbols) if needed; return the directory holding the .so."""
    omitted = sorted(set(omit))
    unknown = [s for s in omitted if s not in STANDIN_SYMBOLS]
    if unknown:
        raise StandinBuildError(f"cannot omit {unknown}: the stand-in does not export them")
    header = find_nvml_header()
    cc = _compiler()
    defines = [f"-DOMIT_{s}" for s in omitted]
    key = hashlib.sha256()
    # Everything that shapes the binary, this builder included (an older builder may have linked other sources).
    for part in (
        *(p.read_bytes() for p in (*SOURCES, *HEADERS, Path(__file__))),
        header.read_bytes(),
        _compiler_identity(cc).encode(),
        " ".join([*cc, *CFLAGS, *LIBS, *defines]).encode(),
    ):
        key.update(hashlib.sha256(part).digest())
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / key.hexdigest()[:24]
    if (final / SONAME).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=root, prefix=".build-"))
    try:
        argv = [*cc, *CFLAGS, *defines, f"-I{header.parent}", "-o", str(work / SONAME), *map(str, SOURCES), *LIBS]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StandinBuildError(f"C compiler failed to run ({shlex.join(argv)}): {exc}") from exc
        if res.returncode != 0:
            raise StandinBuildError(
                f"compiling the stand-in failed (exit {res.returncode}): {shlex.join(argv)}\n{res.stderr.strip()}"
            )
        (work / "omit.txt").write_text("".join(f"{s}\n" for s in omitted))
        try:
            work.rename(final)  # atomic; loses the race harmlessly if a parallel build got there first
        except OSError:
            if not (final / SONAME).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final
