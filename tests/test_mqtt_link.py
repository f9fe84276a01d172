"""The MQTT edge's callbacks on their own (the network paths are tested against Mosquitto)."""

from __future__ import annotations

import logging

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from agent.link.mqtt_link import MqttLink
from agent.settings.declarations import MqttConfig


def link() -> MqttLink:
    return MqttLink(
        MqttConfig(), "voice-agent-test", "voice/test/status", {"voice/test/speak": _drop}
    )


def _drop(topic: str, payload: bytes, mid: object) -> None:
    del topic, payload, mid


@pytest.mark.allow_error_logs("broker refused a subscription: Not authorized")
def test_a_refused_subscription_is_reported_and_sends_the_link_through_reconnect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    under_test = link()
    granted = ReasonCode(PacketTypes.SUBACK, "Granted QoS 1")
    refused = ReasonCode(PacketTypes.SUBACK, "Not authorized")
    with caplog.at_level(logging.ERROR):
        under_test._on_subscribe(under_test._client, None, 1, [granted, refused], None)
    assert under_test.last_error == "broker refused a subscription: Not authorized"
    assert "reconnecting later" in caplog.text


def test_granted_subscriptions_change_nothing() -> None:
    under_test = link()
    granted = ReasonCode(PacketTypes.SUBACK, "Granted QoS 1")
    under_test._on_subscribe(under_test._client, None, 1, [granted, granted], None)
    assert under_test.last_error is None
