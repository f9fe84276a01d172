"""The route table: which topics the agent subscribes to, how each message becomes one event,
and which source (topic family) it counts against in the inbox.

Pure: a route parses a payload into an event (or the reason it cannot be served) and touches
nothing else; the app runs it on paho's network thread and puts the event on the inbox: in the
urgent lane when it is an alarm-class request (`urgency`), else in its source's budget. A
source that is full has its messages answered `queue_full` (`overflowed`); `may_be_alarm` is
the cheap look at a payload (`lanes.may_be_alarm`) that decides whether reading it is
worth it then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.core.messages import (
    AckRequested,
    Delivery,
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
    RoutedEvent,
)
from agent.protocol.lanes import may_be_alarm
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
from agent.protocol.rooms import (
    COMMAND,
    HERMES,
    HOMEASSISTANT,
    OTA,
    SPEAK,
    NewId,
    no_room,
    rank,
    request_of,
)
from agent.protocol.topics import Topics
from agent.settings.declarations import AgentConfig

PRIORITIES = {p.label: p for p in Priority}

Route = Callable[[str, bytes, Delivery], RoutedEvent]
"""Topic, payload and delivery in; one event out. Never raises for any payload."""


Peek = Callable[[bytes], bool]
"""Whether a payload may hold an alarm-class request (True when unsure): read only then, when
its source has no room."""


def never(_payload: bytes) -> bool:
    return False


def always(_payload: bytes) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class RouteTable:
    """Topic filters and their routes; `restored` are the filters whose retained message is
    state to restore at (re)subscribe (every other retained command is not replayed);
    `sources` the inbox source of each filter, `peeks` the look that tells whether one of its
    payloads may be urgent."""

    routes: Mapping[str, Route]
    restored: frozenset[str]
    sources: Mapping[str, str]
    peeks: Mapping[str, Peek]


def route_table(
    config: AgentConfig,
    topics: Topics,
    new_id: NewId,
    voice_names: Mapping[str, str] | None = None,
) -> RouteTable:
    """Every subscription of a node with this config, and its route; `voice_names` maps the
    names people see (Home Assistant's voice select) to voice ids."""
    limits = SpeakLimits(config.speak.max_payload_bytes, config.speak.max_text_chars)
    speak, stop, ack = (
        _speak(limits, new_id),
        _stop(new_id),
        _checked(parse_ack, AckRequested, new_id),
    )
    # topic -> (route, source, peek)
    table: dict[str, tuple[Route, str, Peek]] = {
        topics.speak: (speak, SPEAK, may_be_alarm),
        topics.speak_all: (speak, SPEAK, may_be_alarm),
        topics.say: (_plain(limits, new_id), SPEAK, never),  # always class info
        topics.stop: (stop, COMMAND, never),
        topics.ack: (ack, COMMAND, never),
        topics.volume: (_checked(parse_volume, VolumeRequested, new_id), COMMAND, never),
        topics.replay: (lambda _t, _p, delivery: ReplayRequested(delivery), COMMAND, never),
        topics.voice: (_voice(voice_names or {}, new_id), COMMAND, never),
    }
    for group in config.speak.groups:  # a group's messages are the node's own
        table[topics.group(group, "speak")] = table[topics.speak]
        table[topics.group(group, "stop")] = table[topics.stop]
        table[topics.group(group, "ack")] = table[topics.ack]
    if config.homeassistant.discovery:
        table[config.homeassistant.birth_topic] = (_birth, HOMEASSISTANT, never)
    if config.hermes.enabled:
        site = config.hermes.site_id
        priority = PRIORITIES[config.hermes.priority]
        urgent = always if priority >= Priority.ALARM else never
        table |= {
            hermes.SAY: (_hermes_say(site, limits, new_id, priority), HERMES, urgent),
            hermes.play_bytes_topic(site): (_hermes_play(site, new_id, priority), HERMES, urgent),
            hermes.SET_VOLUME: (_hermes_volume(site), HERMES, never),
            hermes.TOGGLE_ON: (_hermes_toggle(site, on=True), HERMES, never),
            hermes.TOGGLE_OFF: (_hermes_toggle(site, on=False), HERMES, never),
            hermes.GET_VOICES: (_hermes_voices(site), HERMES, never),
        }
    if config.ota.trusted_keys:
        ota = (_ota(new_id), OTA, never)
        table[topics.ota] = ota
        table[f"{topics.prefix}/all/ota"] = ota
        for group in config.ota.groups:
            table[f"{topics.prefix}/group/{group}/ota"] = ota
        table[topics.revocation] = (_revocation(new_id), OTA, never)
    return RouteTable(
        {topic: route for topic, (route, _, _) in table.items()},
        frozenset({topics.revocation}),
        {topic: source for topic, (_, source, _) in table.items()},
        {topic: peek for topic, (_, _, peek) in table.items()},
    )


def _stop(new_id: NewId) -> Route:
    return _checked(parse_stop, lambda parsed, d: StopRequested(parsed[0], d, parsed[1]), new_id)


def urgency(event: RoutedEvent) -> int:
    """The inbox rank of an event: its class for an alarm-class request (alarm, critical), 0
    for anything else (`rooms.rank`)."""
    return rank(_request(event))


def _request(event: RoutedEvent | None) -> SpeakRequest | None:
    if isinstance(event, HermesRequest) and isinstance(event.parsed, SpeakRequest):
        return event.parsed
    return request_of(event)


def overflowed(
    event: RoutedEvent | None, source: str, new_id: NewId, *, taken: bool = False
) -> SpeakInvalid | None:
    """The answer to a message whose source had no room in the inbox (`event` None: it was not
    read): `rejected` `queue_full`, under the request's id when it has one (`rooms.no_room`);
    None for what needs no answer (Home Assistant's birth, another site's Hermes message).
    `taken`: the inbox had taken it (a higher class took its place), so the answer acknowledges
    its delivery; else the link acknowledged it already."""
    if isinstance(event, HomeAssistantBirth | Ignored):
        return None
    delivery = getattr(event, "delivery", None) if taken else None
    return no_room(
        _request(event), source, new_id, delivery if isinstance(delivery, Delivery) else None
    )


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
