"""The Sparkplug B payload schema, declared for the `protobuf` library, which does every byte of
the encoding and decoding. Pure.

The schema is the one of the Sparkplug 3.0 specification (chapter 6, "Payloads"; Eclipse Tahu's
`sparkplug_b.proto` is its reference copy): message `org.eclipse.tahu.protobuf.Payload` with its
`Metric`, `MetaData`, `PropertySet` and `PropertyValue`, the same field numbers and types. The
Tahu file is EPL-2.0 without a secondary licence, which GPL-3.0 code may not include, so it is
neither copied nor compiled into this project: the fields are declared here as a
`FileDescriptorProto` and the library builds the message classes from it. `DataSet` and
`Template` values are not declared (the node never sends them; one in a command is an unknown
field, kept by the parser and refused as a type the metric does not take). The tests decode what
the node sends with an independent implementation (pysparkplug, built from the Tahu file) and
check the node reads what it sends (`tests/test_sparkplug.py`).
"""

from __future__ import annotations

from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE: Final = "org.eclipse.tahu.protobuf"

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_UINT32, _UINT64, _FLOAT, _DOUBLE = _F.TYPE_UINT32, _F.TYPE_UINT64, _F.TYPE_FLOAT, _F.TYPE_DOUBLE
_BOOL, _STRING, _BYTES, _MESSAGE = _F.TYPE_BOOL, _F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_MESSAGE

_VALUES: Final = (
    ("int_value", _UINT32),
    ("long_value", _UINT64),
    ("float_value", _FLOAT),
    ("double_value", _DOUBLE),
    ("boolean_value", _BOOL),
    ("string_value", _STRING),
)
"""The scalar members of every `value` oneof, in their order (field numbers follow)."""


def _field(
    message: Any,
    name: str,
    number: int,
    kind: int,
    *,
    label: int = _OPTIONAL,
    type_name: str = "",
    oneof: int | None = None,
) -> None:
    field = message.field.add(name=name, number=number, type=kind, label=label)
    if type_name:
        field.type_name = f".{PACKAGE}.Payload.{type_name}"
    if oneof is not None:
        field.oneof_index = oneof


def _schema() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name="voice_agent/sparkplug_b.proto", package=PACKAGE, syntax="proto2"
    )
    payload = file.message_type.add(name="Payload")

    meta = payload.nested_type.add(name="MetaData")
    for number, (name, kind) in enumerate(
        (
            ("is_multi_part", _BOOL),
            ("content_type", _STRING),
            ("size", _UINT64),
            ("seq", _UINT64),
            ("file_name", _STRING),
            ("file_type", _STRING),
            ("md5", _STRING),
            ("description", _STRING),
        ),
        start=1,
    ):
        _field(meta, name, number, kind)

    value = payload.nested_type.add(name="PropertyValue")
    value.oneof_decl.add(name="value")
    _field(value, "type", 1, _UINT32)
    _field(value, "is_null", 2, _BOOL)
    for number, (name, kind) in enumerate(_VALUES, start=3):
        _field(value, name, number, kind, oneof=0)
    _field(value, "propertyset_value", 9, _MESSAGE, type_name="PropertySet", oneof=0)
    _field(value, "propertysets_value", 10, _MESSAGE, type_name="PropertySetList", oneof=0)

    properties = payload.nested_type.add(name="PropertySet")
    _field(properties, "keys", 1, _STRING, label=_REPEATED)
    _field(properties, "values", 2, _MESSAGE, label=_REPEATED, type_name="PropertyValue")

    property_sets = payload.nested_type.add(name="PropertySetList")
    _field(property_sets, "propertyset", 1, _MESSAGE, label=_REPEATED, type_name="PropertySet")

    metric = payload.nested_type.add(name="Metric")
    metric.oneof_decl.add(name="value")
    _field(metric, "name", 1, _STRING)
    _field(metric, "alias", 2, _UINT64)
    _field(metric, "timestamp", 3, _UINT64)
    _field(metric, "datatype", 4, _UINT32)
    _field(metric, "is_historical", 5, _BOOL)
    _field(metric, "is_transient", 6, _BOOL)
    _field(metric, "is_null", 7, _BOOL)
    _field(metric, "metadata", 8, _MESSAGE, type_name="MetaData")
    _field(metric, "properties", 9, _MESSAGE, type_name="PropertySet")
    for number, (name, kind) in enumerate(_VALUES, start=10):
        _field(metric, name, number, kind, oneof=0)
    _field(metric, "bytes_value", 16, _BYTES, oneof=0)

    _field(payload, "timestamp", 1, _UINT64)
    _field(payload, "metrics", 2, _MESSAGE, label=_REPEATED, type_name="Metric")
    _field(payload, "seq", 3, _UINT64)
    _field(payload, "uuid", 4, _STRING)
    _field(payload, "body", 5, _BYTES)
    return file


_POOL: Final = descriptor_pool.DescriptorPool()
_POOL.Add(_schema())

Payload: Final[Any] = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName(f"{PACKAGE}.Payload")
)
"""The Sparkplug B payload message class (`Payload.Metric`, `Payload.PropertySet`, ... nested)."""
