"""The route table: which topics the agent subscribes to, and how each message becomes one event.

Pure: a route parses a payload into an event (or the reason it cannot be served) and touches
nothing else; the app runs it on paho's network thread and puts the event on the inbox.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.core.messages import (
    AckRequested,
    Delivery,
    Event,
    Priority,
    Rejection,
    ReplayRequested,
    SpeakInvalid,
    SpeakReceived,
    SpeakRequest,
    StopRequested,
    VoiceSelected,
    VolumeRequested,
)
from agent.protocol import hermes
from agent.protocol.inputs import (
    HermesRequest,
    HermesToggle,
    HermesVoicesAsked,
    HomeAssistantBirth,
    Ignored,
    OtaCommand,
)
from agent.protocol.manifest import MAX_ENVELOPE_BYTES
from agent.protocol.payloads import (
    MAX_ID_CHARS,
    SpeakLimits,
    parse_ack,
    parse_json_object,
    parse_say,
    parse_speak,
    parse_stop,
    parse_voice,
    parse_volume,
    valid_id,
)
from agent.protocol.topics import Topics
from agent.settings.declarations import AgentConfig

PRIORITIES = {p.label: p for p in Priority}

RoutedEvent = (
    Event
    | HermesRequest
    | HermesToggle
    | HermesVoicesAsked
    | HomeAssistantBirth
    | Ignored
    | OtaCommand
)
"""What a route makes of a message."""
Route = Callable[[str, bytes, Delivery], RoutedEvent]
"""Topic, payload and delivery in; one event out. Never raises for any payload."""
NewId = Callable[[], str]


@dataclass(frozen=True, slots=True)
class RouteTable:
    """Topic filters and their routes; `restored` are the filters whose retained message is
    state to restore at (re)subscribe (every other retained command is not replayed)."""

    routes: Mapping[str, Route]
    restored: frozenset[str]


def route_table(
    config: AgentConfig,
    topics: Topics,
    new_id: NewId,
    voice_names: Mapping[str, str] | None = None,
) -> RouteTable:
    """Every subscription of a node with this config, and its route; `voice_names` maps the
    names people see (Home Assistant's voice select) to voice ids."""
    limits = SpeakLimits(config.speak.max_payload_bytes, config.speak.max_text_chars)
    routes: dict[str, Route] = {
        topics.speak: _speak(limits, new_id),
        topics.speak_all: _speak(limits, new_id),
        topics.say: _plain(limits, new_id),
        topics.stop: _checked(
            parse_stop, lambda parsed, d: StopRequested(parsed[0], d, parsed[1]), new_id
        ),
        topics.ack: _checked(parse_ack, AckRequested, new_id),
        topics.volume: _checked(parse_volume, VolumeRequested, new_id),
        topics.replay: lambda _t, _p, delivery: ReplayRequested(delivery),
        topics.voice: _voice(voice_names or {}, new_id),
    }
    for group in config.speak.groups:  # a group's messages are the node's own
        routes[topics.group(group, "speak")] = routes[topics.speak]
        routes[topics.group(group, "stop")] = routes[topics.stop]
        routes[topics.group(group, "ack")] = routes[topics.ack]
    if config.homeassistant.discovery:
        routes[config.homeassistant.birth_topic] = _birth
    if config.hermes.enabled:
        site = config.hermes.site_id
        priority = PRIORITIES[config.hermes.priority]
        routes |= {
            hermes.SAY: _hermes_say(site, limits, new_id, priority),
            hermes.play_bytes_topic(site): _hermes_play(site, new_id, priority),
            hermes.SET_VOLUME: _hermes_volume(site),
            hermes.TOGGLE_ON: _hermes_toggle(site, on=True),
            hermes.TOGGLE_OFF: _hermes_toggle(site, on=False),
            hermes.GET_VOICES: _hermes_voices(site),
        }
    if config.ota.trusted_keys:
        ota = _ota(new_id)
        routes[topics.ota] = ota
        routes[f"{topics.prefix}/all/ota"] = ota
        for group in config.ota.groups:
            routes[f"{topics.prefix}/group/{group}/ota"] = ota
        routes[topics.revocation] = _revocation(new_id)
    return RouteTable(routes, frozenset({topics.revocation}))


def _speak(limits: SpeakLimits, new_id: NewId) -> Route:
    def route(_topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
        parsed = parse_speak(payload, limits, new_id)
        if isinstance(parsed, Rejection):
            return SpeakInvalid(parsed, delivery)
        return SpeakReceived(parsed, delivery)

    return route


def _checked(
    parse: Callable[[bytes, NewId], Any],
    event: Callable[[Any, Delivery], RoutedEvent],
    new_id: NewId,
) -> Route:
    """A command whose parser gives a value or a Rejection."""

    def route(_topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
        parsed = parse(payload, new_id)
        if isinstance(parsed, Rejection):
            return SpeakInvalid(parsed, delivery)
        return event(parsed, delivery)

    return route


def _plain(limits: SpeakLimits, new_id: NewId) -> Route:
    """The say topic: plain text only (Home Assistant's notify and text entities)."""

    def route(_topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
        parsed = parse_say(payload, limits, new_id)
        if isinstance(parsed, Rejection):
            return SpeakInvalid(parsed, delivery)
        return SpeakReceived(parsed, delivery)

    return route


def _voice(names: Mapping[str, str], new_id: NewId) -> Route:
    """A voice id, or the name Home Assistant's select shows for it."""

    def route(_topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
        chosen = parse_voice(payload, new_id)
        if isinstance(chosen, Rejection):
            return SpeakInvalid(chosen, delivery)
        return VoiceSelected(names.get(chosen, chosen), delivery)

    return route


def _birth(_topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
    if payload.strip() == b"online":
        return HomeAssistantBirth(delivery)
    return Ignored(delivery)


def _hermes_say(site: str, limits: SpeakLimits, new_id: NewId, priority: Priority) -> Route:
    def route(_topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
        parsed = hermes.parse_say(payload, site, limits, new_id)
        if parsed is None:
            return Ignored(delivery)
        request, context = parsed
        return HermesRequest(context, _classed(request, priority), delivery)

    return route


def _hermes_play(site: str, new_id: NewId, priority: Priority) -> Route:
    def route(topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
        parsed = hermes.parse_play_bytes(topic, payload, site, new_id)
        if parsed is None:
            return Ignored(delivery)
        request, context = parsed
        return HermesRequest(context, _classed(request, priority), delivery)

    return route


def _hermes_volume(site: str) -> Route:
    def route(_topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
        volume = hermes.parse_set_volume(payload, site)
        if volume is None:
            return Ignored(delivery)
        if isinstance(volume, Rejection):
            return SpeakInvalid(volume, delivery)
        return VolumeRequested(volume, delivery)

    return route


def _classed(request: SpeakRequest | Rejection, priority: Priority) -> SpeakRequest | Rejection:
    """A Hermes request in the class `hermes.priority` gives it."""
    return request if isinstance(request, Rejection) else replace(request, priority=priority)


def _hermes_toggle(site: str, *, on: bool) -> Route:
    def route(_topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
        if hermes.parse_site(payload, site):
            return HermesToggle(on, delivery)
        return Ignored(delivery)

    return route


def _hermes_voices(site: str) -> Route:
    def route(_topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
        asked = hermes.parse_get_voices(payload, site)
        if asked is None:
            return Ignored(delivery)
        return HermesVoicesAsked(asked.get("id"), delivery)

    return route


def _revocation(new_id: NewId) -> Route:
    """The retained revocation: a signed envelope, handed to the updater as a command."""

    def route(_topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
        body = parse_json_object(payload, MAX_ENVELOPE_BYTES, new_id)
        if isinstance(body, Rejection):
            return OtaCommand(body.id, None, delivery, body.detail)
        return OtaCommand(f"revocation-{new_id()[:8]}", {"revocation": body}, delivery)

    return route


def _ota(new_id: NewId) -> Route:
    def route(_topic: str, payload: bytes, delivery: Delivery) -> RoutedEvent:
        body = parse_json_object(payload, MAX_ENVELOPE_BYTES + 4096, new_id)
        if isinstance(body, Rejection):
            return OtaCommand(body.id, None, delivery, body.detail)
        offer = body.get("id")
        if offer is not None and not valid_id(offer):
            problem = f"id: expected a string of 1-{MAX_ID_CHARS} printable characters"
            return OtaCommand(new_id(), None, delivery, problem)
        return OtaCommand(offer if isinstance(offer, str) else new_id(), body, delivery)

    return route
