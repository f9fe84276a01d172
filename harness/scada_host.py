# mypy: ignore-errors
# (It runs in the SCADA stand-in's own venv, with pysparkplug and paho-mqtt 1.x, which the
# project's venv does not have: `harness/scada.py` explains how to type-check it there.)
"""The SCADA stand-in's child process: a Sparkplug B 3.0 primary host application built on
pysparkplug, and for the stand-in's own tests a pysparkplug edge node; driven as JSON lines.

It runs in the stand-in's venv (`harness/scada.py` builds it: pysparkplug needs paho-mqtt < 2,
the project has 2.x), so it imports only the standard library, pysparkplug, paho-mqtt 1.x and
protobuf. Nothing of the agent.

    python scada_host.py host --broker-host H --broker-port P --host-id ID [--keepalive S]
        [--subscribe FILTER]
    python scada_host.py edge --broker-host H --broker-port P --group G --edge E --device D

A password, if any, comes in the environment variable SCADA_PASSWORD (not on the command line).
stdin: one JSON command a line, `{"op": ..., "id": n, ...}`, answered by a `reply` event with
the same id; stdout: one JSON event a line, `{"kind": ...}`. End of stdin stops it gracefully,
and so does SIGTERM.

The host (MQTT 3.1.1, clean session) connects with its death certificate as will
(`spBv1.0/STATE/<host_id>`, `{"online": false, "timestamp": T}`, retained, QoS 1); once its
subscription to `spBv1.0/#` is acknowledged it publishes its birth, the same with `online`
true and the will's timestamp T (Sparkplug 3.0: tck-id-host-topic-phid-birth-payload-timestamp),
retained, QoS 1. Before each reconnect it sets a new will with a new timestamp. Every message
under `spBv1.0/` is decoded with pysparkplug and reported as a `message` event; bytes that do
not decode are reported as such, with their length, and the host carries on.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import paho.mqtt.client as mqtt
from google.protobuf.json_format import MessageToDict
from pysparkplug import (
    Client,
    DataType,
    DBirth,
    DCmd,
    DData,
    DDeath,
    Device,
    EdgeNode,
    Message,
    MessageType,
    Metric,
    NBirth,
    NCmd,
    NDeath,
    QoS,
    State,
    Topic,
    get_current_timestamp,
)
from pysparkplug import _protobuf as protobuf  # the generated classes: properties, wire facts

NAMESPACE = "spBv1.0"
RAW_SHOWN = 512
"""Bytes of an undecodable payload shown (as hex) in its report; its length is always given."""
PUBLISH_TIMEOUT = 30.0
"""Seconds a QoS 1 publication (STATE) may take to be acknowledged."""

log = logging.getLogger("scada_host")


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


class Output:
    """JSON lines on stdout, one writer at a time (the MQTT thread and the command loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def emit(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"kind": kind, **fields}, default=repr)
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


# ---------------------------------------------------------------------------------------------
# Datatypes and values between JSON and pysparkplug
# ---------------------------------------------------------------------------------------------


def datatype_name(datatype: int) -> str:
    """The Sparkplug name of a datatype (`String`, `Int64`, `DateTime`, as the specification and
    the protobuf enum spell them); the number as text if it has none."""
    try:
        return str(protobuf.DataType.Name(int(datatype)))
    except ValueError:
        return str(int(datatype))


def _squash(text: str) -> str:
    return text.replace("_", "").replace(" ", "").lower()


_DATATYPES = {_squash(member.name): member for member in DataType}


def parse_datatype(given: Any) -> DataType:
    """A datatype from a command: a Sparkplug name (`Float`, `Int64`), pysparkplug's enum name
    (`FLOAT`, `INT8_ARRAY`), either in any case, or the number."""
    if isinstance(given, bool):
        raise ValueError(f"not a datatype: {given!r}")
    if isinstance(given, int):
        return DataType(given)
    if isinstance(given, str) and _squash(given) in _DATATYPES:
        return _DATATYPES[_squash(given)]
    raise ValueError(f"unknown datatype {given!r}")


def to_json(value: Any) -> Any:
    """A decoded metric value as JSON: bytes as hex, datetimes as epoch milliseconds, arrays as
    lists."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime.datetime):
        return round(value.timestamp() * 1000)
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    return value


def _ms_to_datetime(value: Any) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(int(value) / 1000, tz=datetime.UTC)


def _from_hex(value: Any) -> bytes:
    return bytes.fromhex(value) if isinstance(value, str) else bytes(value)


_FROM_JSON: dict[DataType, Callable[[Any], Any]] = {
    DataType.BYTES: _from_hex,
    DataType.FILE: _from_hex,
    DataType.DATETIME: _ms_to_datetime,
    DataType.DATETIME_ARRAY: lambda value: tuple(_ms_to_datetime(v) for v in value),
    DataType.FLOAT: float,
    DataType.DOUBLE: float,
}


def from_json(value: Any, datatype: DataType) -> Any:
    """A command's JSON value in the form pysparkplug encodes for the datatype (the inverse of
    `to_json`: hex for bytes, epoch milliseconds for datetimes, lists for arrays)."""
    if value is None:
        return None
    convert = _FROM_JSON.get(datatype)
    if convert is not None:
        return convert(value)
    return tuple(value) if datatype.name.endswith("_ARRAY") else value


# ---------------------------------------------------------------------------------------------
# Property sets (pysparkplug's Metric has none: read and written on its generated protobuf)
# ---------------------------------------------------------------------------------------------


def read_property_set(properties: Any) -> dict[str, Any]:
    """A PropertySet as `{key: {"type": "String", "value": ...}}` (`is_null` when it is)."""
    found: dict[str, Any] = {}
    for key, value in zip(properties.keys, properties.values, strict=False):
        entry: dict[str, Any] = {"type": datatype_name(value.type)}
        field = value.WhichOneof("value")
        if value.is_null:
            entry["is_null"] = True
        if field == "propertyset_value":
            entry["value"] = read_property_set(value.propertyset_value)
        elif field == "propertysets_value":
            entry["value"] = [read_property_set(p) for p in value.propertysets_value.propertyset]
        elif field is not None:
            raw = getattr(value, field)
            try:
                entry["value"] = to_json(DataType(value.type).decode(raw))
            except (ValueError, NotImplementedError, OverflowError, AttributeError):
                entry["value"] = to_json(raw)
        found[key] = entry
    return found


def write_property_set(target: Any, given: Mapping[str, Any]) -> None:
    """Fill a PropertySet from `{key: {"type": ..., "value": ...}}` (the shape read above)."""
    for key, entry in given.items():
        datatype = parse_datatype(entry["type"])
        value = entry.get("value")
        target.keys.append(key)
        item = target.values.add()
        item.type = int(datatype)
        if entry.get("is_null") or value is None:
            item.is_null = True
        elif datatype == DataType.PROPERTYSET:
            write_property_set(item.propertyset_value, value)
        elif datatype == DataType.PROPERTYSETLIST:
            for each in value:
                write_property_set(item.propertysets_value.propertyset.add(), each)
        else:
            setattr(item, datatype.field, datatype.encode(from_json(value, datatype)))


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


def metric_report(metric: Metric, wire: Any) -> dict[str, Any]:
    """One metric as pysparkplug decoded it (name and datatype resolved from the birth when the
    message gave only an alias), with what was on the wire beside it."""
    report: dict[str, Any] = {
        "name": metric.name,
        "alias": metric.alias,
        "datatype": datatype_name(metric.datatype),
        "datatype_id": int(metric.datatype),
        "value": to_json(metric.value),
        "timestamp": metric.timestamp,
        "is_null": metric.is_null,
        "is_historical": metric.is_historical,
        "is_transient": metric.is_transient,
        "wire_name": wire.name if wire.HasField("name") else None,
        "wire_datatype": datatype_name(wire.datatype) if wire.HasField("datatype") else None,
    }
    if wire.HasField("properties"):
        report["properties"] = read_property_set(wire.properties)
    if metric.metadata is not None:
        fields = dataclasses.asdict(metric.metadata)
        report["metadata"] = {k: v for k, v in fields.items() if v is not None}
    return report


Key = tuple[str | None, str | None, str | None]


class Decoder:
    """Decodes what arrives under `spBv1.0/` with pysparkplug, keeping the births it needs to
    resolve aliases and left-out datatypes (per group, edge node and device, as pysparkplug's
    own Client does; a node's birth or death forgets its devices' births)."""

    def __init__(self) -> None:
        self._births: dict[Key, Any] = {}

    def decode(self, msg: mqtt.MQTTMessage) -> dict[str, Any]:
        raw = bytes(msg.payload)
        try:
            topic_text = msg.topic
        except UnicodeDecodeError:
            topic_text = bytes(msg._topic).decode("utf-8", "replace")
        report: dict[str, Any] = {
            "topic": topic_text,
            "qos": msg.qos,
            "retain": bool(msg.retain),
            "received": time.time(),
            "length": len(raw),
            "type": None,
            "group": None,
            "edge": None,
            "device": None,
            "host_id": None,
            "decoded": False,
            "error": None,
        }
        try:
            topic = Topic.from_str(topic_text)
            report["type"] = None if topic.message_type is None else str(topic.message_type)
            report["group"] = topic.group_id
            report["edge"] = topic.edge_node_id
            report["device"] = topic.device_id
            report["host_id"] = topic.sparkplug_host_id
            key: Key = (topic.group_id, topic.edge_node_id, topic.device_id)
            message = Message.from_mqtt_message(msg, birth=self._births.get(key))
            self._describe(message.payload, raw, report)
            self._remember(key, message.payload)
        except Exception as error:  # noqa: BLE001 - any bytes at all: reported, never fatal
            report["decoded"] = False
            report["error"] = f"{type(error).__name__}: {error}"
            report["raw_hex"] = raw[:RAW_SHOWN].hex()
            report["protobuf"] = _best_effort(raw)
        return report

    @staticmethod
    def _describe(payload: Any, raw: bytes, report: dict[str, Any]) -> None:
        if isinstance(payload, State):
            report.update(decoded=True, online=payload.online, timestamp=payload.timestamp)
            return
        # Timestamp and seq from the wire: pysparkplug's NDeath.decode reads the timestamp only
        # when it is absent (0.6.1), and its DDeath.decode makes a missing seq 0.
        wire = protobuf.Payload.FromString(raw)
        report["timestamp"] = wire.timestamp if wire.HasField("timestamp") else None
        report["seq"] = wire.seq if wire.HasField("seq") else None
        if isinstance(payload, NDeath):
            metrics: tuple[Metric, ...] = (payload.bd_seq_metric,)
        else:
            metrics = tuple(getattr(payload, "metrics", ()))
        report["metrics"] = [
            metric_report(m, w) for m, w in zip(metrics, wire.metrics, strict=False)
        ]
        if wire.HasField("uuid"):
            report["uuid"] = wire.uuid
        if isinstance(payload, NBirth | NDeath):
            bd_seq = [m["value"] for m in report["metrics"] if m["name"] == "bdSeq"]
            report["bdSeq"] = bd_seq[0] if bd_seq else None
        report["decoded"] = True

    def _remember(self, key: Key, payload: Any) -> None:
        if isinstance(payload, NBirth | NDeath):
            group, edge, _ = key
            for known in [k for k in self._births if k[:2] == (group, edge)]:
                del self._births[known]
        elif isinstance(payload, DDeath):
            self._births.pop(key, None)
        if isinstance(payload, NBirth | DBirth):
            self._births[key] = payload


def _best_effort(raw: bytes) -> dict[str, Any] | None:
    """What protobuf alone makes of bytes pysparkplug refused (None if not even that)."""
    try:
        parsed = protobuf.Payload.FromString(raw)
        return dict(MessageToDict(parsed, preserving_proto_field_name=True))
    except Exception:  # noqa: BLE001 - garbage is expected here
        return None


# ---------------------------------------------------------------------------------------------
# Encoding commands
# ---------------------------------------------------------------------------------------------


def build_metric(spec: Mapping[str, Any]) -> Metric:
    """A pysparkplug Metric from `{"name" or "alias", "datatype", "value", "timestamp"?,
    "is_null"?}` (the value as `from_json` reads it)."""
    name, alias = spec.get("name"), spec.get("alias")
    if name is None and alias is None:
        raise ValueError(f"a metric needs a name or an alias: {dict(spec)}")
    datatype = parse_datatype(spec["datatype"])
    value = from_json(spec.get("value"), datatype)
    timestamp = spec.get("timestamp", get_current_timestamp())
    return Metric(
        timestamp=None if timestamp is None else int(timestamp),
        name=name,
        datatype=datatype,
        value=value,
        alias=None if alias is None else int(alias),
        is_historical=bool(spec.get("is_historical", False)),
        is_transient=bool(spec.get("is_transient", False)),
        is_null=bool(spec.get("is_null", False)) or value is None,
    )


def encode_payload(spec: Mapping[str, Any]) -> bytes:
    """A Sparkplug payload from JSON, `{"timestamp"?, "seq"?, "metrics": [...]}`, each metric as
    for `build_metric` plus optional `properties` (`read_property_set`'s shape); datatypes are
    written unless `"datatypes": false`. For tests that need what pysparkplug's classes do not
    make (properties, a chosen seq, no timestamp with `"timestamp": null`)."""
    payload = protobuf.Payload()
    timestamp = spec.get("timestamp", get_current_timestamp())
    if timestamp is not None:
        payload.timestamp = int(timestamp)
    if spec.get("seq") is not None:
        payload.seq = int(spec["seq"])
    for given in spec.get("metrics", ()):
        pb = build_metric(given).to_pb(include_dtype=bool(spec.get("datatypes", True)))
        if given.get("properties"):
            write_property_set(pb.properties, given["properties"])
        payload.metrics.append(pb)
    return bytes(payload.SerializeToString())


# ---------------------------------------------------------------------------------------------
# The host application
# ---------------------------------------------------------------------------------------------


class Host:
    """A Sparkplug B 3.0 primary host application on paho-mqtt 1.x (the transport pysparkplug
    itself uses), its payloads encoded and decoded by pysparkplug."""

    def __init__(self, args: argparse.Namespace, out: Output) -> None:
        self.args = args
        self.out = out
        self.host_id: str = args.host_id
        self.state_topic = str(
            Topic(message_type=MessageType.STATE, sparkplug_host_id=args.host_id)
        )
        self.decoder = Decoder()
        self.stopping = False
        self._subscribe_mid: int | None = None
        self._will_timestamp = 0
        client_id = args.client_id or f"scada-{args.host_id}-{os.getpid()}"
        self.client = mqtt.Client(client_id=client_id, clean_session=True, protocol=mqtt.MQTTv311)
        self.client.enable_logger(log)
        if args.username is not None:
            self.client.username_pw_set(args.username, os.environ.get("SCADA_PASSWORD"))
        self.client.reconnect_delay_set(1, 2)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_disconnect = self._on_disconnect
        self.client.message_callback_add(f"{NAMESPACE}/#", self._on_message)
        self._set_will()

    def _state_payload(self, online: bool, timestamp: int) -> bytes:
        return bytes(State(timestamp=timestamp, online=online).encode())

    def _set_will(self) -> None:
        """The death certificate for the next CONNECT; its birth will repeat this timestamp."""
        self._will_timestamp = get_current_timestamp()
        payload = self._state_payload(False, self._will_timestamp)
        self.client.will_set(self.state_topic, payload, qos=1, retain=True)

    def start(self) -> None:
        self.client.connect_async(
            self.args.broker_host, self.args.broker_port, keepalive=self.args.keepalive
        )
        self.client.loop_start()

    # -- MQTT callbacks (paho's thread) --------------------------------------------------------

    def _on_connect(self, client: mqtt.Client, _userdata: Any, flags: Any, rc: int) -> None:
        self.out.emit("connected", rc=rc, session_present=bool(flags.get("session present")))
        if rc == 0:
            _, self._subscribe_mid = client.subscribe(self.args.subscribe, qos=1)

    def _on_subscribe(self, _client: mqtt.Client, _userdata: Any, mid: int, granted: Any) -> None:
        if mid != self._subscribe_mid:
            return
        self.out.emit("subscribed", topic=self.args.subscribe, granted=list(granted))
        payload = self._state_payload(True, self._will_timestamp)
        self.client.publish(self.state_topic, payload, qos=1, retain=True)
        self.out.emit("state_published", online=True, timestamp=self._will_timestamp, birth=True)

    def _on_disconnect(self, _client: mqtt.Client, _userdata: Any, rc: int) -> None:
        self.out.emit("disconnected", rc=rc)
        if not self.stopping:
            self._set_will()  # a new death certificate before paho reconnects

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            self.out.emit("message", **self.decoder.decode(msg))
        except Exception:  # the decoder reports what it cannot read; this is a bug of ours
            log.exception("could not report a message on %r", msg.topic)

    # -- commands (the main thread) ------------------------------------------------------------

    def command(self, request: Mapping[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "dcmd":
            topic = Topic(
                message_type=MessageType.DCMD,
                group_id=request["group"],
                edge_node_id=request["edge"],
                device_id=request["device"],
            )
            return self._command(topic, DCmd, request)
        if op == "ncmd":
            topic = Topic(
                message_type=MessageType.NCMD,
                group_id=request["group"],
                edge_node_id=request["edge"],
            )
            return self._command(topic, NCmd, request)
        if op == "state":
            timestamp = int(request.get("timestamp") or get_current_timestamp())
            payload = self._state_payload(bool(request["online"]), timestamp)
            self._publish(self.state_topic, payload, qos=1, retain=True)
            return {"topic": self.state_topic, "timestamp": timestamp, "payload": payload.decode()}
        if op == "publish":
            if "payload_hex" in request:
                payload = bytes.fromhex(request["payload_hex"])
            else:
                payload = encode_payload(request["payload"])
            qos, retain = int(request.get("qos", 0)), bool(request.get("retain", False))
            self._publish(request["topic"], payload, qos=qos, retain=retain)
            return {"topic": request["topic"], "payload_hex": payload.hex()}
        raise ValueError(f"unknown op {op!r}")

    def _command(
        self, topic: Topic, kind: type[DCmd | NCmd], request: Mapping[str, Any]
    ) -> dict[str, Any]:
        metrics = tuple(build_metric(m) for m in request["metrics"])
        timestamp = int(request.get("timestamp") or get_current_timestamp())
        message = Message(
            topic=topic,
            payload=kind(timestamp=timestamp, metrics=metrics),
            qos=QoS(0),
            retain=False,
        )
        payload = bytes(message.payload.encode(include_dtypes=bool(request.get("datatypes", True))))
        self._publish(str(topic), payload, qos=0, retain=False)  # Sparkplug: commands at QoS 0
        return {"topic": str(topic), "timestamp": timestamp, "payload_hex": payload.hex()}

    def _publish(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise RuntimeError(f"publish on {topic} failed: {mqtt.error_string(info.rc)}")
        if qos > 0:
            info.wait_for_publish(PUBLISH_TIMEOUT)
            if not info.is_published():
                raise RuntimeError(f"publish on {topic} not acknowledged in {PUBLISH_TIMEOUT} s")

    def stop(self) -> None:
        """Gracefully: the death certificate published (retained, QoS 1), then a DISCONNECT (so
        the broker drops the will)."""
        self.stopping = True
        if self.client.is_connected():
            payload = self._state_payload(False, get_current_timestamp())
            try:
                self._publish(self.state_topic, payload, qos=1, retain=True)
                self.out.emit("state_published", online=False, birth=False)
            except (RuntimeError, ValueError) as error:
                self.out.emit("error", error=f"STATE offline at stop: {error}")
        self.client.disconnect()
        self.client.loop_stop()


# ---------------------------------------------------------------------------------------------
# The edge node (for the stand-in's own tests: pysparkplug's EdgeNode and Device)
# ---------------------------------------------------------------------------------------------

DEFAULT_NODE_METRICS: tuple[dict[str, Any], ...] = (
    {"name": "Node Control/Rebirth", "alias": 101, "datatype": "Boolean", "value": False},
    {"name": "Node Control/Next Server", "alias": 102, "datatype": "Boolean", "value": False},
)
DEFAULT_DEVICE_METRICS: tuple[dict[str, Any], ...] = (
    {"name": "Speak", "alias": 1, "datatype": "String", "value": ""},
    {"name": "Priority", "alias": 2, "datatype": "String", "value": "normal"},
    {"name": "Stop", "alias": 3, "datatype": "Boolean", "value": False},
    {"name": "Acknowledge", "alias": 4, "datatype": "Boolean", "value": False},
    {"name": "Volume", "alias": 5, "datatype": "Float", "value": 0.5},
)


def _brief(metrics: Iterable[Metric]) -> list[dict[str, Any]]:
    return [
        {
            "name": m.name,
            "alias": m.alias,
            "datatype": datatype_name(m.datatype),
            "value": to_json(m.value),
        }
        for m in metrics
    ]


class _Reported(logging.Handler):
    """Errors logged by pysparkplug's client (paho's thread) as `edge_error` events."""

    def __init__(self, out: Output) -> None:
        super().__init__(logging.ERROR)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        self.out.emit("edge_error", error=record.getMessage())


class Edge:
    """A pysparkplug EdgeNode with one Device that echoes every command back: a DCMD as DDATA
    (by name through `update_device`; a metric the command named only by alias comes back by
    alias only, without datatype, as a compressed DDATA), an NCMD as NDATA."""

    def __init__(self, args: argparse.Namespace, out: Output) -> None:
        self.args = args
        self.out = out
        node_specs = json.loads(args.node_metrics) if args.node_metrics else DEFAULT_NODE_METRICS
        device_specs = (
            json.loads(args.device_metrics) if args.device_metrics else DEFAULT_DEVICE_METRICS
        )
        self.client = Client(
            client_id=args.client_id or f"edge-{args.group}-{args.edge}-{os.getpid()}",
            username=args.username,
            password=os.environ.get("SCADA_PASSWORD") if args.username else None,
        )
        # A command pysparkplug cannot decode raises in paho's thread: keep the edge alive, and
        # report what paho logs about it (through pysparkplug's logger) as an edge_error
        self.client._client.suppress_exceptions = True
        logging.getLogger("pysparkplug").addHandler(_Reported(out))
        node_metrics = [build_metric(m) for m in node_specs]
        device_metrics = [build_metric(m) for m in device_specs]
        self.names = {
            m.alias: m.name for m in [*node_metrics, *device_metrics] if m.alias is not None
        }
        self.node = EdgeNode(
            args.group, args.edge, node_metrics, client=self.client, cmd_callback=self._on_ncmd
        )
        self.device = Device(args.device, device_metrics, cmd_callback=self._on_dcmd)
        self.node.register(self.device)

    def start(self) -> None:
        self.node.connect(
            self.args.broker_host, port=self.args.broker_port, keepalive=self.args.keepalive
        )
        self.out.emit("edge_started", group=self.args.group, edge=self.args.edge)

    def _resolved(self, metric: Metric) -> Metric:
        name = metric.name
        if name is None:
            if metric.alias is None:
                raise ValueError(f"a command's metric has neither name nor alias: {metric}")
            name = self.names[metric.alias]
        return dataclasses.replace(metric, name=name, timestamp=get_current_timestamp())

    def _on_dcmd(self, node: EdgeNode, message: Message) -> None:
        try:
            assert isinstance(message.payload, DCmd)
            metrics = message.payload.metrics
            self.out.emit("edge_command", type="DCMD", metrics=_brief(metrics))
            by_name = [self._resolved(m) for m in metrics if m.name is not None]
            by_alias = [m for m in metrics if m.name is None]
            if by_name:
                node.update_device(self.device.device_id, by_name)
            if by_alias:
                self.device.update([self._resolved(m) for m in by_alias])
                echoed = tuple(
                    Metric(
                        timestamp=get_current_timestamp(),
                        name=None,
                        datatype=m.datatype,
                        value=m.value,
                        alias=m.alias,
                    )
                    for m in by_alias
                )
                topic = Topic(
                    message_type=MessageType.DDATA,
                    group_id=node.group_id,
                    edge_node_id=node.edge_node_id,
                    device_id=self.device.device_id,
                )
                data = DData(timestamp=get_current_timestamp(), seq=node._seq, metrics=echoed)
                self.client.publish(Message(topic=topic, payload=data, qos=QoS(0), retain=False))
        except Exception as error:  # noqa: BLE001 - a test's odd command: reported, not fatal
            self.out.emit("edge_error", error=f"{type(error).__name__}: {error}")

    def _on_ncmd(self, node: EdgeNode, message: Message) -> None:
        try:
            assert isinstance(message.payload, NCmd)
            metrics = [self._resolved(m) for m in message.payload.metrics]
            self.out.emit("edge_command", type="NCMD", metrics=_brief(metrics))
            node.update(metrics)
        except Exception as error:  # noqa: BLE001 - as above
            self.out.emit("edge_error", error=f"{type(error).__name__}: {error}")

    def command(self, request: Mapping[str, Any]) -> dict[str, Any]:
        if request.get("op") == "ddata":
            self.node.update_device(
                self.device.device_id, [build_metric(m) for m in request["metrics"]]
            )
            return {}
        raise ValueError(f"unknown op {request.get('op')!r}")

    def stop(self) -> None:
        """pysparkplug's graceful end: an NDEATH published, then a DISCONNECT."""
        self.node.disconnect()


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def _serve(role: Host | Edge, out: Output) -> None:
    """Answer commands from stdin until `stop` or its end."""
    for line in sys.stdin:
        if not line.strip():
            continue
        request_id = None
        try:
            request = json.loads(line)
            request_id = request.get("id")
            if request.get("op") == "stop":
                return
            result = role.command(request)
            out.emit("reply", id=request_id, ok=True, result=result)
        except Exception as error:  # noqa: BLE001 - a bad command is answered, not fatal
            out.emit("reply", id=request_id, ok=False, error=f"{type(error).__name__}: {error}")


def _terminate(_signum: int, _frame: Any) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scada_host.py")
    parser.add_argument("role", choices=["host", "edge"])
    parser.add_argument("--broker-host", default="127.0.0.1")
    parser.add_argument("--broker-port", type=int, default=1883)
    parser.add_argument("--username")
    parser.add_argument("--client-id")
    parser.add_argument("--keepalive", type=int, default=10)
    parser.add_argument("--host-id", help="host: the primary host application id")
    parser.add_argument(
        "--subscribe",
        default=f"{NAMESPACE}/#",
        help="host: the topic filter it reads (default: every Sparkplug message)",
    )
    parser.add_argument("--group", help="edge: the group id")
    parser.add_argument("--edge", help="edge: the edge node id")
    parser.add_argument("--device", help="edge: the device id")
    parser.add_argument("--node-metrics", help="edge: JSON list of the node's metrics")
    parser.add_argument("--device-metrics", help="edge: JSON list of the device's metrics")
    parser.add_argument("--debug", action="store_true", help="paho's log on stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.role == "host" and not args.host_id:
        parser.error("host needs --host-id")
    if args.role == "edge" and not (args.group and args.edge and args.device):
        parser.error("edge needs --group, --edge and --device")
    out = Output()
    signal.signal(signal.SIGTERM, _terminate)
    role: Host | Edge = Host(args, out) if args.role == "host" else Edge(args, out)
    role.start()
    try:
        _serve(role, out)
    finally:
        role.stop()
        out.emit("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
