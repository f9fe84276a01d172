"""The tiers an installed release carries (variants of its model, e.g. INT8), read back at start
from the active slot and checked against the release's signed manifest, kept in the slot when
it was installed (`update_store.RELEASE_ENVELOPE`).

A tier is offered to the node's choice only when the envelope's signature is by a trusted key,
the manifest is the installed release (its number and model digest are the state's), the CPU
has what the tier relies on (`requires`, x86-64 only), and each of its files is the regular
file the manifest signed (sha256; opened without following a link, through `update_store`). A
tier that fails any of these is named with the reason (the state says it), never used.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from agent.core.refusal import Refused
from agent.protocol import manifest as manifests
from agent.protocol.manifest import TierEntry
from agent.updates import update_store as store
from agent.updates.update_store import UpdateState

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

_LOGGER = logging.getLogger(__name__)

CPUINFO_MAX_BYTES: Final = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SlotTier:
    """A tier of the installed release, its files checked."""

    name: str
    path: Path
    """The variant's `.onnx` in the slot."""
    sha256: str
    json_sha256: str
    release: int


@dataclass(frozen=True, slots=True)
class ReleaseTiers:
    """What the installed release carries: the usable tiers and why others are not."""

    tiers: tuple[SlotTier, ...] = ()
    refused: tuple[str, ...] = ()


def carried(
    directory: Path,
    state: UpdateState,
    trusted: Iterable[str],
    flags: frozenset[str] | None = None,
    machine: str | None = None,
) -> ReleaseTiers:
    """The tiers of the active slot's release (see the module); none for the configured
    model or a slot without its envelope."""
    if state.active is None or state.model is None:
        return ReleaseTiers()
    keys: dict[str, Ed25519PublicKey] = {}
    for text in trusted:
        key = manifests.public_key_from_text(text)
        keys[manifests.key_id(key)] = key
    try:
        envelope = store.read_limited(
            directory,
            ("slots", state.active, store.RELEASE_ENVELOPE),
            manifests.MAX_ENVELOPE_BYTES,
        )
    except FileNotFoundError:
        return ReleaseTiers()
    except (OSError, ValueError) as err:
        return ReleaseTiers(refused=(f"the release's manifest cannot be read: {err}"[:200],))
    release = manifests.verify(envelope, keys)
    if isinstance(release, Refused):
        return ReleaseTiers(refused=(f"the release's manifest: {release.detail}"[:200],))
    if release.release != state.release or release.model.sha256 != state.model_sha256:
        return ReleaseTiers(refused=("the slot's manifest is not the installed release's",))
    usable: list[SlotTier] = []
    refused: list[str] = []
    have = cpu_flags() if flags is None else flags
    arch = platform.machine() if machine is None else machine
    for tier in release.tiers:
        problem = _tier_problem(directory, state.active, tier, have, arch)
        if problem is not None:
            refused.append(f"{tier.name}: {problem}"[:200])
            continue
        usable.append(
            SlotTier(
                tier.name,
                directory / "slots" / state.active / tier.variant.path,
                tier.variant.sha256,
                tier.json.sha256,
                release.release,
            )
        )
    return ReleaseTiers(tuple(usable), tuple(refused))


def _tier_problem(
    directory: Path, slot: str, tier: TierEntry, flags: frozenset[str], machine: str
) -> str | None:
    if tier.requires and machine in ("x86_64", "AMD64") and not flags & set(tier.requires):
        return f"this CPU has none of {', '.join(tier.requires)}"
    files: Mapping[str, str] = {f.path: f.sha256 for f in tier.files}
    return store.files_problem(directory, slot, files)


def cpu_flags() -> frozenset[str]:
    """The CPU's flags as /proc/cpuinfo names them (x86 `flags`, ARM `Features`)."""
    try:
        text = Path("/proc/cpuinfo").read_bytes()[:CPUINFO_MAX_BYTES].decode("ascii", "replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()
