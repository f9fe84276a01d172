"""The machine the node runs on, for Home Assistant's device page: its maker and model, read
from the device tree (Raspberry Pi and other boards) or DMI (PCs), else generic names.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Final

_DEVICE_TREE: Final = Path("/proc/device-tree/model")
_DMI: Final = Path("/sys/class/dmi/id")
_MAKERS: Final = {"Raspberry Pi": "Raspberry Pi Ltd"}
"""Makers of boards whose device-tree model names the board only."""


def board() -> tuple[str, str]:
    """(manufacturer, model) of this machine, stable across software and model updates."""
    model = _read(_DEVICE_TREE).rstrip("\0")
    if model:
        maker = next((m for prefix, m in _MAKERS.items() if model.startswith(prefix)), "")
        return maker or model.split()[0], model
    vendor, product = _read(_DMI / "sys_vendor"), _read(_DMI / "product_name")
    if vendor or product:
        return vendor or "Unknown maker", product or "Unknown model"
    return "Generic", f"{platform.machine()} computer"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""
