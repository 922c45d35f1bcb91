"""What the daemon's libraries cost by themselves, and what its config validation costs on top of them.

    python bench/import_floor.py [--rounds 3] [--baseline TREE]

Each figure is RSS and CPU added by one step, each step on top of the ones before, in a fresh interpreter started
with ``-S`` (no ``site``: no ``.pth`` file of this machine runs; site-packages comes through ``PYTHONPATH``), the
median of ``--rounds`` interpreters:

1. ``floor``: the card's packages imported and nothing else (asyncio, aiohttp.web, PyYAML, RE2, prometheus-client).
2. ``config``: the same libraries, then the config's validation library (msgspec; pydantic in a tree from before
   the port), then gpuwatchd's config sections (``gpuwatchd.config.loader``, every section) with the defaults
   loaded through ``load_config``, then a config file's worth of sections validated (a receiver, routes, rules,
   probes): what the daemon pays for its config. Also says whether pydantic was loaded at the end.
3. ``baseline`` (with ``--baseline TREE``, e.g. a worktree of the commit before): step 2 in that tree, interleaved
   with this one's rounds.
4. ``tls``: ``ssl``, then the two TLS client contexts aiohttp's ``connector.py`` builds at import (verified,
   from ``ssl.create_default_context``; unverified, with ``set_default_verify_paths``): the CA store read twice.

Last line: ``floor_mb=… floor_cpu_ms=… config_mb=… config_cpu_ms=… config_loads_pydantic=…
[baseline_config_mb=… baseline_config_cpu_ms=… baseline_loads_pydantic=…] tls_contexts_mb=… tls_contexts_cpu_ms=…``
(the config figures: the validation library's import plus the sections, on top of the libraries).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
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

_CONFIG = """
step(CONFIG_LIBRARY[0], lambda: [importlib.import_module(m) for m in CONFIG_LIBRARY[1]])
def sections():
    from gpuwatchd.config.loader import load_config
    globals()["defaults"] = load_config(None)
step("gpuwatchd's config sections, the defaults loaded", sections)
def a_file():
    from gpuwatchd.config.loader import config_from_dict
    globals()["loaded"] = config_from_dict({
        "listen": "127.0.0.1:9945", "nvml": {"poll_interval": "2s"}, "history": {"retention": "2h"},
        "rules": {"expected_gpu_count": 8, "leak": {"window": "20m", "for": "5m"}, "throttle": {"for": "2m"}},
        "notify": {"receivers": [{"name": "team", "type": "slack", "url": "https://hooks.example.com/T0/B0/x"}],
                   "routes": [{"matchers": ['severity="critical"'], "receiver": "team", "group_wait": "0s"}]},
        "probes": {"interval": "2h"}})
step("a config file's sections validated", a_file)
PYDANTIC = any(m == "pydantic" or m.startswith("pydantic.") for m in sys.modules)
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
print(json.dumps({"start": start, "steps": steps, "pydantic": globals().get("PYDANTIC", False)}))
"""

def _env(root: Path) -> dict[str, str]:
    site_packages = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sorted(site_packages)])}


def _config_library(root: Path) -> tuple[str, tuple[str, ...]]:
    """The validation library the tree's config is built on (pydantic before the port to msgspec)."""
    types_py = (root / "gpuwatchd" / "config" / "types.py").read_text(encoding="utf-8")
    return ("msgspec", ("msgspec",)) if "import msgspec" in types_py else (
        "pydantic, pydantic.fields", ("pydantic", "pydantic.fields"))


def _run(body: str, root: Path = ROOT) -> dict[str, object]:
    script = f"LIBRARIES = {LIBRARIES!r}\nCONFIG_LIBRARY = {_config_library(root)!r}\n{_PRELUDE}{body}{_REPORT}"
    out = subprocess.run([sys.executable, "-S", "-c", script], env=_env(root), cwd=root, capture_output=True,
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
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. a worktree of main) measured alike")
    args = ap.parse_args()
    compile_tree(ROOT)
    kinds: dict[str, tuple[str, Path]] = {"floor": (_LIBRARIES, ROOT), "config": (_LIBRARIES + _CONFIG, ROOT)}
    if args.baseline is not None:
        compile_tree(args.baseline.resolve())
        kinds["baseline"] = (_LIBRARIES + _CONFIG, args.baseline.resolve())
    kinds["tls"] = (_TLS, ROOT)
    runs: dict[str, list[dict[str, object]]] = {k: [] for k in kinds}
    for _ in range(args.rounds):  # interleaved: a busier moment of the machine skews every kind alike
        for kind, (body, root) in kinds.items():
            runs[kind].append(_run(body, root))
    results = {k: _median_steps(v) for k, v in runs.items()}
    for kind, (start, steps) in results.items():
        where = f" ({kinds[kind][1]})" if kind == "baseline" else ""
        print(f"{kind}{where} (medians of {args.rounds} interpreters, python -S): interpreter {start:.1f} MB")
        total = start
        for name, mb, ms in steps:
            total += mb
            print(f"  + {name:62s} {mb:5.2f} MB {ms:5.0f} ms cpu")
        print(f"  = {total:.1f} MB")
    floor_start, floor = results["floor"]
    figures: dict[str, float] = {
        "floor_mb": floor_start + sum(mb for _, mb, _ in floor),
        "floor_cpu_ms": sum(ms for _, _, ms in floor),
    }
    for kind, prefix in (("config", "config"), ("baseline", "baseline_config")):
        if kind in results:
            figures[f"{prefix}_mb"] = sum(mb for _, mb, _ in results[kind][1][1:])
            figures[f"{prefix}_cpu_ms"] = sum(ms for _, _, ms in results[kind][1][1:])
            figures[f"{kind}_loads_pydantic"] = float(any(bool(r["pydantic"]) for r in runs[kind]))
    figures["tls_contexts_mb"] = sum(mb for _, mb, _ in results["tls"][1][1:])
    figures["tls_contexts_cpu_ms"] = sum(ms for _, _, ms in results["tls"][1][1:])
    print(" ".join(f"{k}={v:.1f}" if not k.endswith("pydantic") else f"{k}={int(v)}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
