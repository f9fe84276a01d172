"""Loading the configured voices: the default one (from its update slot when a model update is
installed), the others by id, each prewarmed with its synthesis parameters. Part of the
composition: it joins the voice edge and the choice of model at start.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Final, TypeVar

from agent.core.catalog import Catalog, VoiceFacts
from agent.core.egress import EgressPolicy
from agent.core.tiers import TierState, best, verdict, wants_int8
from agent.protocol.inputs import TierDecided, VoicesLoaded
from agent.settings.declarations import AgentConfig
from agent.settings.loading import resolve_cache_dir, resolve_storage_dir
from agent.speech.sessions import use_memory_arena
from agent.speech.synthesizer import VoiceChoice
from agent.speech.tier_build import (
    BUSY_SHARE,
    Built,
    Carried,
    Speed,
    build,
    judge,
    known,
    known_speed,
    measure_speed,
    other_load,
    seal_key,
    tier_dir,
)
from agent.speech.voice import SynthesisParams, Voice, bundled_voice, seed_random
from agent.system import allocator
from agent.updates import release_tiers as release_tiers_of
from agent.updates.model_at_start import fall_back, start_model
from agent.updates.update_store import read_state

_LOGGER = logging.getLogger(__name__)
T = TypeVar("T")


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


def load_engines(config: AgentConfig, voices: Mapping[str, VoiceChoice]) -> VoicesLoaded[Voice]:
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
    return VoicesLoaded(None if replacement is None else replacement.voice, tier)


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


IDLE_SHARE: Final = 0.25
"""The node counts as idle while other processes take less than this share of its CPUs."""
IDLE_WAIT_S: Final = 60.0
"""How long a measurement made on a busy CPU waits for an idle moment to be re-checked: after
it, the busy figure (CPU time: other processes' work is not in it) stands for this run, the
state says how busy it was, and the next start measures again (a busy figure is never taken
from the cache)."""
IDLE_WINDOW_S: Final = 5.0


def start_tier(config: AgentConfig, choice: VoiceChoice) -> TierState:
    """The tier at start: what the worker is to do (measure FP32's speed for `auto`, find a
    variant for `int8`), nothing for `fp32`. Every measurement is the worker's child's, by
    CPU time (`tier_build`): none is made here, beside the voice's first requests."""
    tts = config.tts
    state = TierState(tts.tier, "fp32", None, tts.tier_min_speed)
    del choice  # the worker measures the voice in a child of its own
    if tts.tier == "auto":
        return replace(state, int8="measuring")
    if tts.tier == "int8":
        return replace(state, int8="building")
    return state


def int8_tier(
    config: AgentConfig,
    choice: VoiceChoice,
    state: TierState,
    idle: Callable[[float], bool] | None = None,
) -> TierDecided[Voice]:
    """The worker (on the tier's thread; the children do the work): with `auto`, FP32's speed
    on this CPU; where INT8 is wanted, every variant the installed release carries judged on
    this CPU (else one built here, where memory allows), the fastest that passes loaded. Each
    figure comes sealed from the cache when it is whole, else from a child; one measured on a
    busy CPU is re-checked once the node is idle (`idle`)."""
    cache_dir = resolve_cache_dir(config.cache, os.environ)
    key = seal_key(resolve_storage_dir(config.storage, os.environ))
    model, digest = choice.voice.path, choice.voice.sha256
    folder = tier_dir(cache_dir, digest)
    wait_idle = idle or _idle_within
    if state.setting == "auto":
        cached = known_speed(folder, digest, key)
        speed: Speed | str
        if cached is None or _busy(cached.busy_share):
            speed = _measured(lambda: measure_speed(model, folder, digest, key), wait_idle)
        else:
            speed = cached
        if isinstance(speed, str):
            _LOGGER.warning("INT8 tier: FP32's speed not measured: %s", speed)
            return TierDecided(None, replace(state, int8=f"failed: {speed}"[:200]))
        state = replace(state, fp32_speed=speed.fp32_speed, busy_share=speed.busy_share)
        _LOGGER.info(
            "FP32 speed %.1f s of speech per CPU second (INT8 looked for below %.1f)",
            speed.fp32_speed,
            state.min_speed,
        )
        if not wants_int8(state.setting, speed.fp32_speed, state.min_speed):
            return TierDecided(None, replace(state, int8="not needed"))
    found = release_tiers(config, choice)
    judged: dict[str, Built] = {}
    for tier in found.tiers:
        carried = Carried(tier.name, tier.path, tier.sha256, tier.json_sha256)
        there = tier_dir(cache_dir, digest, tier.sha256)
        result = known(there, digest, key, carried)
        if result is None or _busy(result.busy_share):

            def judged_now(c: Carried = carried, t: Path = there) -> Built:
                return judge(model, c, t, digest, key=key)

            result = _measured(judged_now, wait_idle)
        judged[f"release:{tier.name}"] = result
    if not found.tiers:
        result = known(folder, digest, key)
        if result is None:
            result = build(model, folder, digest, key)
        judged["built"] = result
    state = replace(state, notes=found.refused)
    return _decided(config, state, judged)


def _decided(
    config: AgentConfig, state: TierState, judged: Mapping[str, Built]
) -> TierDecided[Voice]:
    """The fastest variant that passes, loaded; or why none is used."""
    usable = {name: b for name, b in judged.items() if b.error is None and b.path is not None}
    if not usable:
        errors = "; ".join(str(b.error) for b in judged.values()) or "no variant"
        _LOGGER.warning("INT8 tier: %s", errors)
        return TierDecided(None, replace(state, int8=f"failed: {errors}"[:200]))
    choice = best(state.setting, [(n, b.speedup, b.distance_db) for n, b in usable.items()])
    name = choice[0] if choice is not None else max(usable, key=lambda n: usable[n].speedup or 0)
    built = usable[name]
    said = verdict(state.setting, built.speedup, built.distance_db)
    state = replace(
        state,
        int8=said,
        speedup=built.speedup,
        distance_db=built.distance_db,
        source=name,
        busy_share=built.busy_share if built.busy_share is not None else state.busy_share,
        fp32_speed=state.fp32_speed or built.fp32_speed,
    )
    _LOGGER.info(
        "INT8 tier %s: %s (speedup %s by CPU time, distance %s dB)",
        name,
        said,
        built.speedup,
        built.distance_db,
    )
    if choice is None or built.path is None:
        return TierDecided(None, state)
    cache_dir = resolve_cache_dir(config.cache, os.environ)
    voice = Voice.load(built.path, config.tts.threads, cache_dir)
    voice.prewarm()
    return TierDecided(voice, replace(state, used="int8"))


def release_tiers(config: AgentConfig, choice: VoiceChoice) -> release_tiers_of.ReleaseTiers:
    """The tiers the installed release carries, when the default voice is its model."""
    if not config.ota.trusted_keys:
        return release_tiers_of.ReleaseTiers()
    directory = ota_directory(config)
    state = read_state(directory).state
    if state.active is None or state.model is None:
        return release_tiers_of.ReleaseTiers()
    if directory / "slots" / state.active / state.model != choice.voice.path:
        return release_tiers_of.ReleaseTiers()
    return release_tiers_of.carried(directory, state, config.ota.trusted_keys)


def _busy(share: float | None) -> bool:
    return share is not None and share > BUSY_SHARE


def _measured(work: Callable[[], T], idle: Callable[[float], bool]) -> T:
    """A measurement, made again once the node is idle when it was made on a busy CPU (the
    first figure stands when no idle moment comes within IDLE_WAIT_S)."""
    first = work()
    if not _busy(getattr(first, "busy_share", None)):
        return first
    _LOGGER.info("INT8 tier: measured on a busy CPU; re-checking it when the node is idle")
    if not idle(IDLE_WAIT_S):
        return first
    again = work()
    return again if getattr(again, "busy_share", None) is not None else first


def _idle_within(timeout: float) -> bool:
    """Wait (up to `timeout` s) for IDLE_WINDOW_S in which other processes used less than
    IDLE_SHARE of the CPUs; whether one came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy, total = other_load()
        own = time.process_time()
        time.sleep(IDLE_WINDOW_S)
        busy2, total2 = other_load()
        ticks = os.sysconf("SC_CLK_TCK")
        mine = (time.process_time() - own) * ticks
        if total2 > total and (busy2 - busy - mine) / (total2 - total) < IDLE_SHARE:
            return True
    return False
