"""Selective INT8 recipes: which units of a Piper voice are quantized (the rest stay in float),
as `python -m tiers build` chose them by measured sensitivity (tiers.selective).

`DEFAULT` is the selection `python -m tiers build` made for the bundled voice (en_US-joe-medium)
on the project's machine, the same in every build of `make bench` (docs/quantization.md, "The
measurements"): the flow and 18 decoder layers, percentile ranges, 8-bit weights. A node
without a variant from its release builds this one (`python -m tiers.auto --build`):
calibration and one quantization, no search.
Its unit names are those of every medium-quality Piper voice (same architecture); a unit a
model lacks is reported and skipped.
"""

from __future__ import annotations

from typing import Any, Final

DEFAULT: Final[dict[str, Any]] = {
    "units": [
        "dec/resblocks.2/convs.1",
        "flow",
        "dec/resblocks.5/convs.1",
        "dec/resblocks.2/convs.0",
        "dec/resblocks.1/convs.1",
        "dec/resblocks.6/convs.1",
        "dec/resblocks.4/convs.1",
        "dec/resblocks.1/convs.0",
        "dec/resblocks.5/convs.0",
        "dec/resblocks.4/convs.0",
        "dec/resblocks.3/convs.1",
        "dec/resblocks.8/convs.1",
        "dec/resblocks.0/convs.0",
        "dec/resblocks.0/convs.1",
        "dec/resblocks.7/convs.0",
        "dec/resblocks.3/convs.0",
        "dec/ups.1",
        "dec/ups.2",
        "dec/resblocks.6/convs.0",
    ],
    "options": {"reduce_range": False, "calibration": "percentile"},
}
