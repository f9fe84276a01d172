"""The engine's default voice in use: its sessions loaded while the agent already serves, its
INT8 variant built and judged, a switch to a model update or to the variant (only at the
device's sample rate), and every part that speaks with it told. Part of the composition root:
run by the app loop, its two workers report through the inbox (`VoicesLoaded`, `TierDecided`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Protocol

from agent.assembly import Parts
from agent.core.tiers import TierState
from agent.fact_sheet import FactSheet
from agent.protocol.inputs import TierDecided, VoicesLoaded
from agent.settings.declarations import AgentConfig
from agent.sounder_duty import SounderDuty
from agent.speech.synthesizer import VoiceChoice
from agent.speech.voice import Voice
from agent.voices import choice_for, int8_tier, load_engines

_LOGGER = logging.getLogger(__name__)


class SpeaksWithIt(Protocol):
    """A part that speaks with the default voice (the synthesizer, Wyoming's renderer, the
    alarm lane's words): told when it changes, before any later request of its own."""

    def use_voice(self, choice: VoiceChoice) -> None: ...


class DefaultVoice:
    """The default voice of this engine and its tier (the loop's own: the voices dict is the
    one the fact sheet reads)."""

    def __init__(
        self,
        config: AgentConfig,
        voices: dict[str, VoiceChoice],
        parts: Parts,
        sheet: FactSheet,
        duty: SounderDuty | None,
    ) -> None:
        self._config = config
        self._voices = voices
        self._speakers: list[SpeaksWithIt] = [parts.synthesizer]
        if parts.wyoming is not None:
            self._speakers.append(parts.wyoming.renderer)
        if duty is not None:
            self._speakers.append(duty)
        self._inbox = parts.inbox
        self._status = parts.status
        self._catalog = parts.catalog
        self._sheet = sheet
        self._duty = duty
        self._tier = TierState(config.tts.tier, int8="waiting for the voice")  # once loaded
        self._sheet.tier = self._tier
        self._tier_from = ""
        """The digest of the model the INT8 variant is being built from."""

    def start_loading(self) -> None:
        """Load the voices' sessions on a thread of their own (`voices.load_engines`): cached
        phrases play meanwhile; `VoicesLoaded` reaches the loop."""
        voices = dict(self._voices)

        def work() -> None:
            try:
                loaded = load_engines(self._config, voices)
            except Exception as err:
                _LOGGER.exception("The voice does not load")
                loaded = VoicesLoaded(None, self._tier, f"{type(err).__name__}: {err}"[:300])
            self._inbox.report(loaded)

        threading.Thread(target=work, name="voice-loader", daemon=True).start()

    def loaded(self, event: VoicesLoaded[Voice]) -> bool:
        """The voices can speak: a replacement for an installed model that did not load is
        switched to, the sounder told, and the tier's work begins. False: the configured model
        does not load (logged; the agent stops)."""
        if event.error is not None:
            _LOGGER.error("The configured voice does not load: %s; stopping", event.error)
            return False
        if event.replacement is not None:
            self.switch(event.replacement)
        self._tier = self._sheet.tier = event.tier
        self._tell_sounder()
        if self._tier.working:
            self._start_tier_worker()
        self._status.changed()
        return True

    def _start_tier_worker(self) -> None:
        """Build and judge the INT8 variant on a thread of its own (the child builds it);
        `TierDecided` reaches the loop."""
        choice = self._voices["default"]
        self._tier_from = choice.voice.sha256

        def work() -> None:
            try:
                decided = int8_tier(self._config, choice, self._tier)
            except Exception as err:
                _LOGGER.exception("INT8 tier failed")
                decided = TierDecided(None, replace(self._tier, int8=f"failed: {err!r}"[:200]))
            self._inbox.report(decided)

        threading.Thread(target=work, name="tier", daemon=True).start()

    def tier_decided(self, event: TierDecided[Voice]) -> None:
        """The INT8 variant is ready (or refused): switched to when it was built from the model
        still in use (an update may have replaced it meanwhile)."""
        voice, state = event.voice, event.state
        current = self._voices["default"].voice
        if voice is not None and current.sha256 == self._tier_from:
            source = current
            if self.switch(voice):
                self._sheet.tier_source = (source.path.stem, source.sha256, voice.sha256)
            else:
                state = replace(state, used="fp32", int8="refused: another sample rate")
        elif voice is not None:
            state = replace(state, used="fp32", int8="not used: the model changed meanwhile")
        self._tier = self._sheet.tier = state
        self._status.changed()

    def switch(self, voice: Voice) -> bool:
        """Make `voice` the default one (a model update, the INT8 variant): refused (False)
        at another sample rate than the device's, which is the configured default voice's
        (other voices are resampled to it; the default one never is). A model update replaces
        the INT8 variant (the state says `fp32`, `not built`)."""
        if voice.sample_rate != self._voices["default"].voice.sample_rate:
            return False
        choice = choice_for(self._config, "default", voice)
        if self._sheet.tier_source is not None:  # a model update replaces the INT8 variant
            self._sheet.tier_source = None
            self._tier = self._sheet.tier = replace(self._tier, used="fp32", int8="not built")
        self._voices["default"] = choice
        for speaker in self._speakers:  # before any later request: one queue each, in order
            speaker.use_voice(choice)
        self._status.connected(time.monotonic())  # announce the new model
        self._tell_sounder()
        _LOGGER.info("Switched to the model %s (sha256 %s…)", voice.path, voice.sha256[:12])
        return True

    def _tell_sounder(self) -> None:
        if self._duty is not None:
            self._duty.ready(dict(self._catalog.voices), self._voices["default"].voice.sha256)
