"""Selective INT8 recipes: which units of a Piper voice are quantized (the rest stay in float),
as `python -m tiers build` chose them by measured sensitivity (tiers.selective).

`DEFAULT` is the selection made for the bundled voice (en_US-joe-medium) on the project's
machine (docs/quantization.md, "Selective INT8"): a node without a variant from its release
builds this one (`python -m tiers.auto --build`), calibration and one quantization, no search.
Its unit names are those of every medium-quality Piper voice (same architecture); a unit a
model lacks is reported and skipped.
"""

from __future__ import annotations

from typing import Any, Final

DEFAULT: Final[dict[str, Any]] = {
    "units": [
        "dec/resblocks.2/convs.1",
        "flow",
        "dec/resblocks.2/convs.0",
        "dec/resblocks.5/convs.1",
        "dec/resblocks.1/convs.1",
        "dec/resblocks.1/convs.0",
        "dec/resblocks.4/convs.1",
        "dec/resblocks.5/convs.0",
        "dec/resblocks.4/convs.0",
    ],
    "options": {"reduce_range": False},
    "calibration": "minmax",
}
