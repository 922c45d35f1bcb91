"""What ``gpuwatchd doctor --python PATH`` asks another interpreter (the environment that trains), which may not
have gpuwatchd installed: torch's build and its view of the GPUs, as one JSON line in the probe worker's terms.

Run by path as a standalone script (``PATH -I foreign_check.py``): it imports only the standard library and torch.
It lives beside the probe worker because, like it, it is torch's side of the house: the daemon never imports torch.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def check() -> dict[str, Any]:
    """torch's version, CUDA build and whether it can use the GPUs; or why torch is not there."""
    try:
        import torch
    except ImportError as e:
        return {"reason": "torch_not_installed", "detail": str(e)}
    chk: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": False}
    try:
        chk["available"] = bool(torch.cuda.is_available())
        if chk["available"]:
            chk["device_count"] = torch.cuda.device_count()
    except Exception as e:  # any failure of torch's CUDA initialisation is the answer
        chk["error"] = f"{type(e).__name__}: {e}"
    return chk


if __name__ == "__main__":
    print(json.dumps({"check": check()}))
    sys.exit(0)
