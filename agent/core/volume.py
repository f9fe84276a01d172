"""How loud an announcement plays: requested volume times the global volume, with a floor for
alarm and critical that neither can push it under. Pure."""

from __future__ import annotations

from agent.core.messages import Priority

FLOORED = frozenset({Priority.ALARM, Priority.CRITICAL})
"""Classes that never play below the configured floor."""


def effective_volume(
    requested: float, global_volume: float, priority: Priority, floor: float
) -> float:
    """The gain applied to the samples, from 0 to 1."""
    volume = requested * global_volume
    if priority in FLOORED:
        volume = max(volume, floor)
    return min(max(volume, 0.0), 1.0)
