"""What the daemon's libraries cost by themselves, and what config validation would cost on msgspec instead of pydantic.

    python bench/import_floor.py [--rounds 3]

Each figure is RSS and CPU added by one step, each step on top of the ones before, in a fresh interpreter started
with ``-S`` (no ``site``: no ``.pth`` file of this machine runs; site-packages comes through ``PYTHONPATH``), the
median of ``--rounds`` interpreters:

1. ``floor``: the card's packages imported and nothing else (asyncio, aiohttp.web, PyYAML, RE2, prometheus-client),
   then pydantic, then one small pydantic model built (pydantic's schema machinery loads only then).
2. ``pydantic``: the same libraries, pydantic, then gpuwatchd's config models (``gpuwatchd.config.loader``, every
   section) with the defaults loaded through ``load_config``: what the daemon pays for its config today.
3. ``msgspec``: the same libraries, msgspec, then msgspec Structs of the same shape (every model and field, with
   the defaults, from the pydantic models' fields; the validators, aliases' checks and error texts are not
   ported) and the defaults converted: the floor of the same config on msgspec. The shape is read from the models
   in a separate interpreter (pydantic does not load in the measured one). Skipped when msgspec is not installed.
4. ``tls``: ``ssl``, then the two TLS client contexts aiohttp's ``connector.py`` builds at import (verified,
   from ``ssl.create_default_context``; unverified, with ``set_default_verify_paths``): the CA store read twice.

Last line: ``floor_mb=… floor_cpu_ms=… pydantic_config_mb=… pydantic_config_cpu_ms=… msgspec_config_mb=…
msgspec_config_cpu_ms=… tls_contexts_mb=… tls_contexts_cpu_ms=…`` (the config figures: the validation library's import
plus the models, on top of the libraries).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from footprint import compile_tree  # noqa: E402

LIBRARIES = ("asyncio", "aiohttp", "aiohttp.web", "yaml", "re2", "prometheus_client")

_PRELUDE = """
import gc, importlib, json, sys, time
def rss():
    with open('/proc/self/status') as f:
        return next(int(l.split()[1]) / 1024 for l in f if l.startswith('VmRSS'))
steps = []
def step(name, fn):
    gc.collect(); r0, t0 = rss(), time.process_time(); fn(); gc.collect()
    steps.append([name, rss() - r0, (time.process_time() - t0) * 1000])
start = rss()
"""

_LIBRARIES = """
step("libraries: " + ", ".join(LIBRARIES), lambda: [importlib.import_module(m) for m in LIBRARIES])
"""

_FLOOR = """
step("pydantic, pydantic.fields", lambda: [importlib.import_module(m) for m in ("pydantic", "pydantic.fields")])
def one_model():
    from pydantic import BaseModel, ConfigDict, SecretStr, field_validator
    class M(BaseModel):
        model_config = ConfigDict(extra="forbid")
        a: int = 1
        b: SecretStr | None = None
        @field_validator("a")
        @classmethod
        def check(cls, v: int) -> int:
            return v
    M(a=2)
step("one pydantic model built", one_model)
"""

_PYDANTIC = """
step("pydantic, pydantic.fields", lambda: [importlib.import_module(m) for m in ("pydantic", "pydantic.fields")])
def models():
    from gpuwatchd.config.loader import load_config
    load_config(None)
step("gpuwatchd's config models, the defaults loaded", models)
"""

_MSGSPEC = """
import typing
step("msgspec", lambda: importlib.import_module("msgspec"))
SHAPE = json.loads(open(sys.argv[1]).read())
def structs():
    import msgspec
    built = {}
    plain = {"str": str, "int": int, "float": float, "bool": bool, "any": typing.Any}
    def typ(t):
        if isinstance(t, str):
            return plain[t]
        if "struct" in t:
            return built[t["struct"]]
        if "optional" in t:
            inner = typ(t["optional"])
            return typing.Any if inner is typing.Any else typing.Optional[inner]
        if "list" in t:
            return list[typ(t["list"])]
        return dict[str, typ(t["dict"])]
    def needs(fields):
        out = {f["type"]["struct"] for f in fields if isinstance(f["type"], dict) and "struct" in f["type"]}
        return out | {f["factory"] for f in fields if f.get("factory") in SHAPE}
    pending = dict(SHAPE)
    while pending:
        for name, fields in list(pending.items()):
            if needs(fields) - set(built) - {name}:
                continue
            defs = []
            for f in sorted(fields, key=lambda f: not f.get("required")):
                t = typ(f["type"])
                if f.get("required"):
                    defs.append((f["name"], t))
                elif "factory" in f:
                    fac = {"list": list, "dict": dict}.get(f["factory"]) or built.get(f["factory"], lambda: None)
                    defs.append((f["name"], t, msgspec.field(default_factory=fac)))
                elif isinstance(f["default"], (list, dict)):
                    d = f["default"]
                    defs.append((f["name"], t, msgspec.field(default_factory=lambda d=d: type(d)(d))))
                else:
                    defs.append((f["name"], t, f["default"]))
            built[name] = msgspec.defstruct(name, defs, forbid_unknown_fields=True, frozen=True)
            del pending[name]
    globals()["kept"] = (built, msgspec.convert({}, built["Config"]))
step("Structs of the config models' shape, the defaults converted", structs)
"""

_TLS = """
step("ssl", lambda: importlib.import_module("ssl"))
import ssl
def verified():
    globals()["a"] = ssl.create_default_context()
def unverified():
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE
    c.set_default_verify_paths()
    globals()["b"] = c
step("aiohttp's verified TLS context", verified)
step("aiohttp's unverified TLS context", unverified)
"""

_REPORT = """
print(json.dumps({"start": start, "steps": steps}))
"""

# Reads the config models' shape (names, fields, plain types, defaults) in its own interpreter, as JSON.
_SHAPE = """
import json, sys, types, typing
from pydantic import BaseModel, SecretStr
import gpuwatchd.config.loader  # noqa: F401 (every section model)
models = {}
def walk(c):
    for s in c.__subclasses__():
        walk(s)
        if s.__module__.startswith("gpuwatchd.") and s.__module__ != "gpuwatchd.web.webconfig":
            models.setdefault(s.__name__, s)
walk(BaseModel)
def plain(a):
    o = typing.get_origin(a)
    args = typing.get_args(a)
    if o is typing.Annotated:
        return plain(args[0])
    if isinstance(a, type) and issubclass(a, BaseModel):
        return {"struct": a.__name__}
    if o in (typing.Union, types.UnionType):
        rest = [x for x in args if x is not type(None)]
        inner = plain(rest[0]) if len(rest) == 1 else "any"
        return {"optional": inner} if type(None) in args else inner
    if o in (list, tuple, set, frozenset):
        return {"list": plain(args[0]) if args else "any"}
    if o is dict:
        return {"dict": plain(args[1]) if len(args) == 2 else "any"}
    if o is typing.Literal:
        return "str" if all(isinstance(x, str) for x in args) else "any"
    if a is SecretStr:
        return "str"
    return a.__name__ if a in (bool, int, float, str) else "any"
shape = {}
for name, m in models.items():
    fields = []
    for fname, f in m.model_fields.items():
        d = {"name": f.alias or fname, "type": plain(f.annotation)}
        fac = f.default_factory
        if fac is not None:
            d["factory"] = fac.__name__ if isinstance(fac, type) and issubclass(fac, BaseModel) else (
                "list" if fac in (list, tuple) else "dict" if fac is dict else "none")
        elif f.is_required():
            d["required"] = True
        elif isinstance(f.default, BaseModel):
            d["factory"] = type(f.default).__name__
        else:
            try:
                json.dumps(f.default)
                d["default"] = f.default
            except TypeError:
                d["default"] = None
        fields.append(d)
    shape[name] = fields
json.dump(shape, open(sys.argv[1], "w"))
print(len(shape), sum(len(v) for v in shape.values()))
"""


def _env() -> dict[str, str]:
    site_packages = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sorted(site_packages)])}


def _run(body: str, *argv: str) -> dict[str, object]:
    script = f"LIBRARIES = {LIBRARIES!r}\n{_PRELUDE}{body}{_REPORT}"
    out = subprocess.run([sys.executable, "-S", "-c", script, *argv], env=_env(), cwd=ROOT, capture_output=True,
                         text=True, check=True)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _median_steps(runs: list[dict[str, object]]) -> tuple[float, list[tuple[str, float, float]]]:
    start = statistics.median(float(r["start"]) for r in runs)  # type: ignore[arg-type]
    names = [s[0] for s in runs[0]["steps"]]  # type: ignore[attr-defined]
    steps = []
    for i, name in enumerate(names):
        steps.append((name, statistics.median(r["steps"][i][1] for r in runs),  # type: ignore[index]
                      statistics.median(r["steps"][i][2] for r in runs)))  # type: ignore[index]
    return start, steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    compile_tree(ROOT)
    have_msgspec = importlib.util.find_spec("msgspec") is not None
    results: dict[str, tuple[float, list[tuple[str, float, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-floor-") as tmp:
        shape = Path(tmp) / "shape.json"
        made = subprocess.run([sys.executable, "-c", _SHAPE, str(shape)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                              cwd=ROOT, capture_output=True, text=True, check=True)
        models, fields = made.stdout.split()
        kinds: dict[str, tuple[str, ...]] = {
            "floor": (_LIBRARIES + _FLOOR,), "pydantic": (_LIBRARIES + _PYDANTIC,), "tls": (_TLS,),
        }
        if have_msgspec:
            kinds["msgspec"] = (_LIBRARIES + _MSGSPEC, str(shape))
        runs: dict[str, list[dict[str, object]]] = {k: [] for k in kinds}
        for _ in range(args.rounds):  # interleaved: a busier moment of the machine skews every kind alike
            for kind, (body, *argv) in kinds.items():
                runs[kind].append(_run(body, *argv))
        results = {k: _median_steps(v) for k, v in runs.items()}
    for kind, (start, steps) in results.items():
        print(f"{kind} (medians of {args.rounds} interpreters, python -S): interpreter {start:.1f} MB")
        total = start
        for name, mb, ms in steps:
            total += mb
            print(f"  + {name:62s} {mb:5.2f} MB {ms:5.0f} ms cpu")
        print(f"  = {total:.1f} MB")
    if not have_msgspec:
        print("msgspec: not installed (pip install msgspec), its figures are left out")
    print(f"config models' shape: {models} models, {fields} fields")
    floor_start, floor = results["floor"]
    figures = {
        "floor_mb": floor_start + sum(mb for _, mb, _ in floor),
        "floor_cpu_ms": sum(ms for _, _, ms in floor),
        "pydantic_config_mb": sum(mb for _, mb, _ in results["pydantic"][1][1:]),
        "pydantic_config_cpu_ms": sum(ms for _, _, ms in results["pydantic"][1][1:]),
    }
    if have_msgspec:
        figures["msgspec_config_mb"] = sum(mb for _, mb, _ in results["msgspec"][1][1:])
        figures["msgspec_config_cpu_ms"] = sum(ms for _, _, ms in results["msgspec"][1][1:])
    figures["tls_contexts_mb"] = sum(mb for _, mb, _ in results["tls"][1][1:])
    figures["tls_contexts_cpu_ms"] = sum(ms for _, _, ms in results["tls"][1][1:])
    print(" ".join(f"{k}={v:.1f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
