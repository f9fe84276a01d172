"""Trust in what an operator sends: an offer's signed manifest (inline, or fetched from an allowed
host) and a signed revocation, each verified against `ota.trusted_keys` (Ed25519 over the exact
bytes) before anything else is done with it.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from agent.core.egress import EgressPolicy
from agent.core.refusal import Refused
from agent.core.states import UpdateReason
from agent.protocol import manifest as manifests
from agent.protocol.manifest import Manifest, Revocation
from agent.settings.declarations import OtaConfig
from agent.updates.downloads import Downloads

if TYPE_CHECKING:  # loaded by `manifest` where a key is read
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


class ReleaseTrust:
    """The trusted keys, and the checks of manifests and revocations against them."""

    def __init__(self, config: OtaConfig, hosts: EgressPolicy) -> None:
        self._config = config
        self._hosts = hosts
        self._trusted: dict[str, Ed25519PublicKey] = {}
        for text in config.trusted_keys:
            key = manifests.public_key_from_text(text)
            self._trusted[manifests.key_id(key)] = key

    def offer(self, body: dict[str, Any], downloads: Downloads) -> tuple[Manifest, bytes]:
        """An offer's release, verified, and its signed envelope's bytes (kept in the slot: its
        tiers are checked against it at start). Raises Refused."""
        if not self._trusted:
            raise Refused(UpdateReason.NO_TRUSTED_KEYS, "ota.trusted_keys is empty")
        envelope = body.get("manifest")
        if isinstance(envelope, dict):
            data = json.dumps(envelope).encode()
        elif isinstance(body.get("manifest_url"), str):
            url = str(body["manifest_url"])
            if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                raise Refused(UpdateReason.MALFORMED, "manifest_url: expected an http(s) URL")
            if (problem := self._hosts.url_problem(url)) is not None:
                raise Refused(UpdateReason.URL_NOT_ALLOWED, f"manifest_url: {problem}")
            data = downloads.manifest(url)
        else:
            raise Refused(UpdateReason.MALFORMED, "expected `manifest` or `manifest_url`")
        checked = manifests.verify(data, self._trusted)
        if isinstance(checked, Refused):
            raise checked
        return checked, data

    def revocation(self, envelope: object) -> Revocation:
        """A signed revocation, verified and for this device class. Raises Refused."""
        if not self._trusted:
            raise Refused(UpdateReason.NO_TRUSTED_KEYS, "ota.trusted_keys is empty")
        if not isinstance(envelope, dict):
            raise Refused(UpdateReason.MALFORMED, "revocation: expected a signed envelope")
        revocation = manifests.verify_revocation(json.dumps(envelope).encode(), self._trusted)
        if isinstance(revocation, Refused):
            raise revocation
        if revocation.device_class != self._config.device_class:
            raise Refused(UpdateReason.WRONG_TARGET, f"for {revocation.device_class}")
        return revocation
