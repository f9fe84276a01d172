"""Loading the configured voices: the default one (from its update slot when a model update is
installed), the others by id, each prewarmed with its synthesis parameters. Part of the
composition: it joins the voice edge and the choice of model at start.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from agent.core.catalog import Catalog, VoiceFacts
from agent.core.egress import EgressPolicy
from agent.core.tiers import TierState, passes, verdict, wants_int8
from agent.settings.declarations import AgentConfig
from agent.settings.loading import resolve_cache_dir, resolve_storage_dir
from agent.speech.sessions import use_memory_arena
from agent.speech.synthesizer import VoiceChoice
from agent.speech.tier_build import build, known, measure_speed, tier_dir
from agent.speech.voice import SynthesisParams, Voice, bundled_voice, seed_random
from agent.system import allocator
from agent.updates.model_at_start import fall_back, start_model

_LOGGER = logging.getLogger(__name__)


def factory_model(config: AgentConfig) -> Path:
    """The default voice's model as configured (`tts.voice`, or the bundled one)."""
    return config.tts.voice or bundled_voice()


def ota_directory(config: AgentConfig) -> Path:
    """Where model slots, downloads and the update state live."""
    storage = resolve_storage_dir(config.storage, os.environ)
    return config.ota.dir or storage / "ota" / config.node_id


def load_voice(
    config: AgentConfig, voice_id: str = "default", path: Path | None = None
) -> VoiceChoice:
    """Load and prewarm one voice (`default` is `tts.voice`, the bundled one when null)."""
    if path is None:
        path = factory_model(config) if voice_id == "default" else config.tts.voices[voice_id]
    voice = Voice.describe(path, resolve_cache_dir(config.cache, os.environ))
    choice = choice_for(config, voice_id, voice)
    _load_engine(config, choice)
    return choice


def choice_for(config: AgentConfig, voice_id: str, voice: Voice) -> VoiceChoice:
    """A loaded voice under its id, with the configured scales over the voice's own."""
    tts = config.tts
    base = voice.default_params
    params = SynthesisParams(
        base.noise_scale if tts.noise_scale is None else tts.noise_scale,
        base.length_scale if tts.length_scale is None else tts.length_scale,
        base.noise_w if tts.noise_w is None else tts.noise_w,
    )
    return VoiceChoice(voice_id, voice, params)


def load_voices(config: AgentConfig) -> dict[str, VoiceChoice]:
    """Every configured voice, loaded and prewarmed; the default one from its update slot when a
    model update is installed (see `model_at_start.start_model`)."""
    use_memory_arena(not config.tts.low_memory)  # before the first session is made
    if config.tts.low_memory:
        allocator.return_large_blocks()
    factory = default = factory_model(config)
    if config.ota.trusted_keys:
        default = start_model(config.ota, ota_directory(config), factory)
    voices = {"default": _load_default(config, default, factory)}
    voices |= {vid: load_voice(config, vid) for vid in config.tts.voices}
    return voices


def _load_default(config: AgentConfig, model: Path, factory: Path) -> VoiceChoice:
    """The default voice from `model`; an installed model that does not load is left (see
    `model_at_start.fall_back`) for the previous slot, then the configured model, each tried
    once."""
    for _ in range(3):  # the active slot, the previous one, the configured model
        try:
            return load_voice(config, "default", model)
        except Exception as err:
            if model == factory:
                raise  # the configured model itself: nothing to fall back to
            _LOGGER.exception("The installed model %s does not load", model)
            model = fall_back(ota_directory(config), factory, str(err)[:200])
    return load_voice(config, "default", factory)


DELAY_ENV: Final = "VOICE_AGENT_DELAY_VOICE_S"
"""The test hook: seconds the sessions' load waits before it starts (a slow board's load, so a
test can show what plays while the voice loads)."""


def describe_voices(config: AgentConfig) -> dict[str, VoiceChoice]:
    """Every configured voice from its JSON and digest, sessions not loaded (`load_engines`
    loads them while the agent already serves): the default one from its update slot when a
    model update is installed. An installed model whose JSON cannot be read is left as a
    model that does not load (`model_at_start.fall_back`)."""
    use_memory_arena(not config.tts.low_memory)  # before the first session is made
    if config.tts.low_memory:
        allocator.return_large_blocks()
    cache_dir = resolve_cache_dir(config.cache, os.environ)
    factory = model = factory_model(config)
    if config.ota.trusted_keys:
        model = start_model(config.ota, ota_directory(config), factory)
    for _ in range(3):  # the active slot, the previous one, the configured model
        try:
            default = Voice.describe(model, cache_dir)
            break
        except Exception as err:
            if model == factory:
                raise  # the configured model itself: nothing to fall back to
            _LOGGER.exception("The installed model %s cannot be read", model)
            model = fall_back(ota_directory(config), factory, str(err)[:200])
    else:
        default = Voice.describe(factory, cache_dir)
    voices = {"default": choice_for(config, "default", default)}
    for vid, path in config.tts.voices.items():
        voices[vid] = choice_for(config, vid, Voice.describe(path, cache_dir))
    return voices


@dataclass(frozen=True, slots=True)
class VoicesLoaded:
    """Every voice's sessions are loaded and prewarmed: the default voice's replacement when
    its installed model did not load (None: it loaded), and the tier measured at start."""

    replacement: VoiceChoice | None
    tier: TierState
    error: str | None = None
    """The configured model did not load (the agent stops)."""


def load_engines(config: AgentConfig, voices: Mapping[str, VoiceChoice]) -> VoicesLoaded:
    """Load and prewarm the sessions of described voices (on the loader thread: the synthesis
    thread waits for them only when it needs audio the cache does not hold), then measure the
    default voice's speed for its tier. An installed model that does not load is left for the
    previous slot, then the configured model (`_load_default`); the configured model not
    loading is raised."""
    delay = os.environ.get(DELAY_ENV)
    if delay:
        _LOGGER.warning("Test hook: the voices load in %s s", delay)
        time.sleep(float(delay))
    replacement: VoiceChoice | None = None
    default = voices["default"]
    try:
        _load_engine(config, default)
    except Exception as err:
        factory = factory_model(config)
        if default.voice.path == factory:
            raise
        _LOGGER.exception("The installed model %s does not load", default.voice.path)
        model = fall_back(ota_directory(config), factory, str(err)[:200])
        replacement = _load_default(config, model, factory)
    tier = start_tier(config, replacement or default)
    for vid, choice in voices.items():
        if vid != "default":
            _load_engine(config, choice)
    return VoicesLoaded(replacement, tier)


def _load_engine(config: AgentConfig, choice: VoiceChoice) -> None:
    """Load and prewarm one described voice (nothing to do for one already loaded)."""
    voice = choice.voice
    if voice.loaded:
        return
    if config.tts.seed is not None:
        seed_random(config.tts.seed)  # before the session is made: it starts from this seed
    started = time.monotonic()
    voice.load_engine(config.tts.threads, resolve_cache_dir(config.cache, os.environ))
    loaded = time.monotonic()
    voice.prewarm()
    _LOGGER.info(
        "Voice %s (%s, sha256 %s…) loaded in %.2f s, prewarmed in %.2f s",
        choice.id,
        voice.path.name,
        voice.sha256[:12],
        loaded - started,
        time.monotonic() - loaded,
    )


def voice_names(voices: Mapping[str, VoiceChoice]) -> dict[str, str]:
    """What a listener can choose, by the name people see: each voice (`id`), or each speaker
    of a multi-speaker voice (`id#speaker`), named from the voice's JSON (the id added if two
    names match)."""
    labels: dict[str, str] = {}
    for vid, choice in sorted(voices.items(), key=lambda item: (item[0] != "default", item[0])):
        label = choice.voice.info.label(vid)
        speakers = choice.voice.info.speakers
        if speakers:
            labels |= {f"{vid}#{name}": f"{label}, {name}" for name in speakers}
        else:
            labels[vid] = label
    counts = Counter(labels.values())
    return {
        key: f"{label} [{key}]" if counts[label] > 1 else label for key, label in labels.items()
    }


def catalog(
    voices: Mapping[str, VoiceChoice],
    chimes: frozenset[str],
    sounds: frozenset[str],
    media_hosts: EgressPolicy | None = None,
) -> Catalog:
    """What the core checks requests against: each voice's language and speakers, chimes, the
    names of `audio.media` and the hosts of `audio.media_hosts` (None: none)."""
    facts = {
        vid: VoiceFacts(
            choice.voice.info.language,
            choice.voice.info.speakers,
            choice.voice.speaker_count,
        )
        for vid, choice in voices.items()
    }
    return Catalog(facts, chimes, sounds, media_hosts or EgressPolicy())


@dataclass(frozen=True, slots=True)
class TierDecided:
    """The INT8 tier's worker is done: the variant to switch to (None: stay on FP32), and what
    the state says about it."""

    voice: Voice | None
    state: TierState


def start_tier(config: AgentConfig, choice: VoiceChoice) -> TierState:
    """The tier at start: with `auto`, the default voice's speed measured now (before the
    synthesis thread runs: the voice is used by one thread at a time), and whether the INT8
    variant is to be built."""
    tts = config.tts
    speed = measure_speed(choice.voice, choice.params) if tts.tier == "auto" else None
    wanted = wants_int8(tts.tier, speed, tts.tier_min_speed)
    state = TierState(tts.tier, "fp32", speed, tts.tier_min_speed)
    if speed is not None:
        _LOGGER.info(
            "Synthesis speed %.1fx real time (INT8 tier below %.1fx)", speed, tts.tier_min_speed
        )
    return replace(state, int8="building") if wanted else state


def int8_tier(config: AgentConfig, choice: VoiceChoice, state: TierState) -> TierDecided:
    """Build (or find in the cache) and judge the default voice's INT8 variant, and load it if
    it passes (on the tier's worker thread: the child does the building)."""
    cache_dir = resolve_cache_dir(config.cache, os.environ)
    digest = choice.voice.sha256
    folder = tier_dir(cache_dir, digest)
    built = known(folder, digest) or build(choice.voice.path, folder, digest)
    if built.error is not None or built.path is None:
        _LOGGER.warning("INT8 tier: %s", built.error)
        return TierDecided(None, replace(state, int8=f"failed: {built.error}"))
    said = verdict(state.setting, built.speedup, built.distance_db)
    state = replace(state, int8=said, speedup=built.speedup, distance_db=built.distance_db)
    _LOGGER.info(
        "INT8 tier %s (speedup %s, distance %s dB)", said, built.speedup, built.distance_db
    )
    if not passes(state.setting, built.speedup, built.distance_db):
        return TierDecided(None, state)
    voice = Voice.load(built.path, config.tts.threads, cache_dir)
    voice.prewarm()
    return TierDecided(voice, replace(state, used="int8"))
