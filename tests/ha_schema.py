"""Home Assistant MQTT discovery config keys as a machine-checkable schema, for our platforms.

Covers the seven platforms the agent announces: notify, text, button, number, select, sensor and
update. `problems()` checks one entity config (single-component discovery, or one component of a
device-based discovery payload); `device_discovery_problems()` checks a whole device payload;
`update_state_problems()` checks the JSON an update entity's `state_topic` may carry. All take
full (unabbreviated) key names; `expand_abbreviations()` turns an abbreviated payload into that.

The published contract is Home Assistant's documentation. The source is read to confirm it, and
where the two disagree, a comment says so and the documented form is what counts as allowed or
required. Where core is stricter than the documentation (a key the docs call optional but the
core schema requires, a value core rejects), `problems()` also reports it, marked "(core)", unless
`source_checks=False`.

Sources read (stored copies, read through the project's search tools, not the live web):

Documentation, repository home-assistant/home-assistant.io (``source/_integrations/``):
- ``mqtt.markdown`` @ 0a314403e71f: device-based and single-component discovery, shared options,
  origin, availability, "Naming of MQTT Entities" (`object_id`), abbreviation lists. A version
  between HA 2024.11 (device-based discovery is in it) and 2025.10 (no `default_entity_id`).
  https://www.home-assistant.io/integrations/mqtt/
- ``notify.mqtt.markdown`` @ 08520bb1984d (mentions MQTT device subentries: HA 2025.x, still
  `object_id`) and the older @ 172bcca0686c.
  https://www.home-assistant.io/integrations/notify.mqtt/
- ``text.mqtt.markdown`` @ 03ecc9ca97a0 (has `default_entity_id`: HA 2025.10 or later).
  https://www.home-assistant.io/integrations/text.mqtt/
- ``button.mqtt.markdown`` @ d72255663705 (and the older 03048e091609).
  https://www.home-assistant.io/integrations/button.mqtt/
- ``number.mqtt.markdown`` @ ebecc7e80482 (and the older 00042d888204).
  https://www.home-assistant.io/integrations/number.mqtt/
- ``select.mqtt.markdown`` @ 23472596b17b (and the older 03048e091609).
  https://www.home-assistant.io/integrations/select.mqtt/
- ``sensor.mqtt.markdown`` @ 9e4a69ab9987, and a translated mirror of the later page that has
  `default_entity_id` in place of `object_id`.
  https://www.home-assistant.io/integrations/sensor.mqtt/
- ``update.mqtt.markdown`` @ d72255663705 (has `display_precision`, `in_progress`,
  `update_percentage`, `platform`; still `object_id`).
  https://www.home-assistant.io/integrations/update.mqtt/

Source, repository home-assistant/core (``homeassistant/components/mqtt/``):
- ``schemas.py`` @ c6ca7f5f416 (MQTT_ENTITY_COMMON_SCHEMA with `object_id`, device `model_id`)
  and @ 0f5c1b547043 (DEVICE_DISCOVERY_SCHEMA, SHARED_OPTIONS); a later dev-branch
  ``schemas.py`` (stored text, repository not shown; uses ``probatio`` in place of voluptuous)
  with `default_entity_id`, `entity_picture`, `visible_by_default`, `message_expiry_interval`
  in the common schema, no `object_id`, and `check_unique_id` for device components.
- ``const.py`` on ``dev`` (web capture of github.com/home-assistant/core/blob/dev/..., fetched
  2026-09): CONF_DEFAULT_ENTITY_ID present, CONF_OBJECT_ID gone; SUPPORTED_COMPONENTS.
- ``config.py`` @ a5c820922702 (MQTT_RO_SCHEMA: `state_topic` required; MQTT_RW_SCHEMA:
  `command_topic` required, `optimistic`, `retain`, `state_topic`).
- ``notify.py`` @ 78247e60bf4b, ``button.py`` @ 05fd736fa9e7, ``select.py`` (later, schema only),
  ``text.py`` (several versions; older ones reject ``min >= max``, a later one ``min > max``),
  ``number.py`` (version with ``validate_config``: ``min >= max`` is an error), ``sensor.py``
  (version with ``validate_sensor_state_and_device_class_config``), ``update.py``
  @ 4a776668ef6d and a later version with `display_precision`, ``entity.py`` @ e79ecb303a76,
  ``abbreviations.py`` @ 911803bfd294 (old; the documentation's list is used instead).
- ``discovery.py`` as ported into openHAB's MQTT binding (``_replace_topic_base``,
  ``_merge_common_device_options``): how `~` and the shared options reach a component.

The `object_id` deprecation: Home Assistant 2025.10 (first seen in 2025.10.0b1) logs "uses the
deprecated option `object_id` ... Replace ... with `default_entity_id` ... This will stop working
in Home Assistant Core 2026.4" (quoted in github.com/home-assistant/addons/issues/4240,
github.com/zivillian/ism7mqtt/issues/171, github.com/Sennevds/system_sensors/issues/190).
Discovery schemas drop unknown keys (``extra=vol.REMOVE_EXTRA``), so a payload may carry both
keys and work on either side of the change.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Final, TypeAlias

Check: TypeAlias = Callable[[object], "str | None"]
"""A value check: the reason the value is wrong, or None."""

# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------

COMMON_KEYS: Final[frozenset[str]] = frozenset(
    {
        # Availability. mqtt.markdown "Using Availability topics" ("Platform specific
        # availability settings"), repeated on every platform page; core schemas.py
        # MQTT_AVAILABILITY_SCHEMA. `availability` and `availability_topic` exclude each other.
        # (The number page @ ebecc7e8 omits availability_template and the top-level payload_*
        # keys; mqtt.markdown and core have them for every MQTT entity platform.)
        "availability",
        "availability_mode",
        "availability_template",
        "availability_topic",
        "payload_available",
        "payload_not_available",
        # Device registry and origin. Every platform page (`device` map);
        # mqtt.markdown "Discovery payload" (`origin`); core schemas.py MQTT_ENTITY_COMMON_SCHEMA.
        "device",
        "origin",
        # Entity identity and presentation. Every platform page; core MQTT_ENTITY_COMMON_SCHEMA.
        # `icon` is missing from the text page's option list (@ 03ecc9ca) although its example
        # uses it; the other six pages and core list it.
        "unique_id",
        "name",
        "icon",
        "entity_category",
        "entity_picture",
        "enabled_by_default",
        # Entity ID. `object_id`: documented up to HA 2025.9, deprecated in 2025.10, "will stop
        # working in 2026.4" (HA's warning), and gone from the dev-branch core schema.
        # `default_entity_id` (a full entity ID such as "text.foobar"): HA 2025.10 and later
        # (text.mqtt page @ 03ecc9ca; dev core schemas.py). Older HA drops it silently.
        "object_id",
        "default_entity_id",
        # JSON attributes. Every platform page; core MQTT_ENTITY_COMMON_SCHEMA.
        "json_attributes_topic",
        "json_attributes_template",
        # Transport. Every platform page; core config.py SCHEMA_BASE.
        "qos",
        "encoding",
        # Only in a component of a device-based discovery payload, where it is required
        # (each platform page: "Only allowed and required in MQTT auto discovery device
        # messages"; mqtt.markdown "Device discovery payload").
        "platform",
    }
)
"""Keys every MQTT entity of these platforms accepts in discovery (full names only)."""

PLATFORM_KEYS: Final[dict[str, frozenset[str]]] = {
    # notify.mqtt.markdown @ 08520bb1; core notify.py.
    "notify": frozenset({"command_topic", "command_template", "retain"}),
    # text.mqtt.markdown @ 03ecc9ca; core text.py. Core also takes `optimistic` (through
    # MQTT_RW_SCHEMA) which the page does not document: see SOURCE_ONLY_KEYS.
    "text": frozenset(
        {
            "command_topic",
            "command_template",
            "state_topic",
            "value_template",
            "min",
            "max",
            "mode",
            "pattern",
            "retain",
        }
    ),
    # button.mqtt.markdown @ d7225566; core button.py.
    "button": frozenset(
        {"command_topic", "command_template", "device_class", "payload_press", "retain"}
    ),
    # number.mqtt.markdown @ ebecc7e8; core number.py.
    "number": frozenset(
        {
            "command_topic",
            "command_template",
            "state_topic",
            "value_template",
            "min",
            "max",
            "step",
            "mode",
            "unit_of_measurement",
            "device_class",
            "optimistic",
            "payload_reset",
            "retain",
        }
    ),
    # select.mqtt.markdown @ 23472596; core select.py.
    "select": frozenset(
        {
            "command_topic",
            "command_template",
            "state_topic",
            "value_template",
            "options",
            "optimistic",
            "retain",
        }
    ),
    # sensor.mqtt.markdown @ 9e4a69ab; core sensor.py. No command side, no `retain`.
    "sensor": frozenset(
        {
            "state_topic",
            "value_template",
            "device_class",
            "state_class",
            "unit_of_measurement",
            "suggested_display_precision",
            "expire_after",
            "force_update",
            "last_reset_value_template",
            "options",
        }
    ),
    # update.mqtt.markdown @ d7225566; core update.py. `entity_picture` is also an update
    # option of its own on the page (core had it in update.py before it joined the common
    # schema); it is in COMMON_KEYS. The page documents no `command_template`.
    "update": frozenset(
        {
            "state_topic",
            "value_template",
            "latest_version_topic",
            "latest_version_template",
            "command_topic",
            "payload_install",
            "device_class",
            "display_precision",
            "title",
            "release_summary",
            "release_url",
            "retain",
        }
    ),
}
"""Platform-specific keys, as each platform page documents them."""

REQUIRED_KEYS: Final[dict[str, frozenset[str]]] = {
    # notify page: `command_topic` is "required: false" on both stored versions (and in a
    # third-party extraction of the current page, 2026-04). Core notify.py has
    # vol.Required(CONF_COMMAND_TOPIC): docs and source disagree; see SOURCE_REQUIRED_KEYS.
    "notify": frozenset(),
    "text": frozenset({"command_topic"}),
    "button": frozenset({"command_topic"}),
    "number": frozenset({"command_topic"}),
    "select": frozenset({"command_topic", "options"}),
    "sensor": frozenset({"state_topic"}),
    # update page: every option but `platform` is "required: false". Core update.py builds on
    # MQTT_RO_SCHEMA, where `state_topic` is vol.Required: docs and source disagree.
    "update": frozenset(),
}
"""Keys the documentation marks required, per platform, in any discovery config."""

DEVICE_DISCOVERY_REQUIRED_KEYS: Final[frozenset[str]] = frozenset({"platform", "unique_id"})
"""Also required in a component of a device-based discovery payload. `platform`: each page,
"Only allowed and required in MQTT auto discovery device messages". `unique_id`: the pages say
"Required when used with device-based discovery" (text, button, number, select, sensor, notify;
the update page @ d7225566 does not repeat it) and mqtt.markdown says "Also required is a
`unique_id` for entity-based components"; dev core schemas.py enforces it (check_unique_id).
A `unique_id` is not required in single-component discovery, but the `device` map "Only works
when `unique_id` is set" (every page)."""

SOURCE_REQUIRED_KEYS: Final[dict[str, frozenset[str]]] = {
    "notify": frozenset({"command_topic"}),  # core notify.py vol.Required; docs: optional
    "update": frozenset({"state_topic"}),  # core config.py MQTT_RO_SCHEMA; docs: optional
}
"""Keys core's schema requires although the documentation marks them optional."""

SOURCE_ONLY_KEYS: Final[dict[str, frozenset[str]]] = {
    # core config.py MQTT_RW_SCHEMA, used by text.py; not on the text page.
    "text": frozenset({"optimistic"}),
    # dev-branch core schemas.py MQTT_ENTITY_COMMON_SCHEMA (2026); not in any page read here.
    "*": frozenset({"visible_by_default", "message_expiry_interval"}),
}
"""Keys some core version accepts that the pages read here do not document. Not allowed by
`problems()`, which follows the documentation; listed so a failure on one is easy to place."""

DEPRECATED_KEYS: Final[dict[str, str]] = {
    "object_id": "deprecated in HA 2025.10 for `default_entity_id`; stops working in 2026.4",
}

DEVICE_KEYS: Final[frozenset[str]] = frozenset(
    {
        # The `device` map on every platform page (same list on all seven); core schemas.py
        # MQTT_ENTITY_DEVICE_INFO_SCHEMA. Core also accepts the long-deprecated `via_hub`
        # (renamed to `via_device`); it is not documented and not allowed here.
        # mqtt.markdown "Sharing of device configuration" says the mandatory device fields were
        # "extended to at least one of `connection` and `identifiers` as well as the `name`",
        # yet its own examples link a second entity with `identifiers` only, and core requires
        # only identifiers/connections; `name` is therefore not enforced here.
        "identifiers",
        "connections",
        "name",
        "manufacturer",
        "model",
        "model_id",
        "sw_version",
        "hw_version",
        "serial_number",
        "suggested_area",
        "via_device",
        "configuration_url",
    }
)
"""Keys allowed in the `device` map. At least one of identifiers/connections must be given."""

ORIGIN_KEYS: Final[frozenset[str]] = frozenset(
    # mqtt.markdown "Discovery payload" (name "(Required)", sw_version, support_url);
    # core schemas.py MQTT_ORIGIN_INFO_SCHEMA (name vol.Required).
    {"name", "sw_version", "support_url"}
)
"""Keys allowed in the `origin` map; `name` is required."""

AVAILABILITY_ENTRY_KEYS: Final[frozenset[str]] = frozenset(
    # `availability` list entries, every platform page and mqtt.markdown; `topic` required.
    {"topic", "payload_available", "payload_not_available", "value_template"}
)

DEVICE_DISCOVERY_SHARED_KEYS: Final[frozenset[str]] = frozenset(
    {
        # mqtt.markdown "Device discovery payload", "Supported shared options": the availability
        # options, `origin` (required; checked on its own), `command_topic`, `state_topic`,
        # `qos`, `encoding`.
        # Docs and source disagree for older core: SHARED_OPTIONS @ 0f5c1b54 (the list core
        # copies into components) lacks `qos` and `encoding`, which DEVICE_DISCOVERY_SCHEMA
        # accepts at the root but which were then not inherited; the dev-branch SHARED_OPTIONS
        # has both (and message_expiry_interval). Set `qos` per component to be safe.
        "availability",
        "availability_mode",
        "availability_template",
        "availability_topic",
        "payload_available",
        "payload_not_available",
        "command_topic",
        "state_topic",
        "qos",
        "encoding",
    }
)
"""Options a device-based discovery payload may set at its root for all its components."""

UPDATE_STATE_KEYS: Final[frozenset[str]] = frozenset(
    {
        # update.mqtt.markdown: "The values in the JSON are optional but must be valid within
        # the following schema". in_progress and update_percentage came with HA 2024.11
        # (home-assistant.io#35475, core#129468, per the project's anchors document).
        "installed_version",
        "latest_version",
        "title",
        "release_summary",
        "release_url",
        "entity_picture",
        "in_progress",
        "update_percentage",
    }
)
"""JSON keys an update entity's `state_topic` payload may carry."""

TEXT_MAX_LIMIT: Final = 255
"""text.mqtt.markdown, `max`: "The maximum size of a text being set or received (maximum is
255)", default 255. Core text.py: `max` must be <= MAX_LENGTH_STATE_STATE (255)."""

RELEASE_SUMMARY_MAX: Final = 255
"""update.mqtt.markdown, `release_summary`: "a brief update description of max 255 characters"."""

NUMBER_STEP_MIN: Final = 0.001
"""number.mqtt.markdown, `step`: "Smallest value `0.001`" (core: vol.Range(min=1e-3))."""

ABBREVIATIONS: Final[dict[str, str]] = {
    # mqtt.markdown @ 0a314403 "Supported abbreviations in MQTT discovery messages", limited to
    # the keys in this schema. The page's prose calls `components` "cmp"; its list and its
    # examples use "cmps". No abbreviation for default_entity_id was in the pages read here.
    "avty": "availability",
    "avty_mode": "availability_mode",
    "avty_t": "availability_topic",
    "avty_tpl": "availability_template",
    "cmd_t": "command_topic",
    "cmd_tpl": "command_template",
    "cmps": "components",
    "dev": "device",
    "dev_cla": "device_class",
    "dsp_prc": "display_precision",
    "e": "encoding",
    "en": "enabled_by_default",
    "ent_cat": "entity_category",
    "ent_pic": "entity_picture",
    "exp_aft": "expire_after",
    "frc_upd": "force_update",
    "ic": "icon",
    "json_attr_t": "json_attributes_topic",
    "json_attr_tpl": "json_attributes_template",
    "l_ver_t": "latest_version_topic",
    "l_ver_tpl": "latest_version_template",
    "lrst_val_tpl": "last_reset_value_template",
    "o": "origin",
    "obj_id": "object_id",
    "ops": "options",
    "opt": "optimistic",
    "p": "platform",
    "pl_avail": "payload_available",
    "pl_inst": "payload_install",
    "pl_not_avail": "payload_not_available",
    "pl_prs": "payload_press",
    "pl_rst": "payload_reset",
    "ptrn": "pattern",
    "rel_s": "release_summary",
    "rel_u": "release_url",
    "ret": "retain",
    "stat_cla": "state_class",
    "stat_t": "state_topic",
    "sug_dsp_prc": "suggested_display_precision",
    "t": "topic",
    "tit": "title",
    "uniq_id": "unique_id",
    "unit_of_meas": "unit_of_measurement",
    "val_tpl": "value_template",
}
"""Abbreviated discovery keys (entity level and availability entries) to full names."""

DEVICE_ABBREVIATIONS: Final[dict[str, str]] = {
    # mqtt.markdown "Supported abbreviations for device registry configuration".
    "cu": "configuration_url",
    "cns": "connections",
    "ids": "identifiers",
    "mf": "manufacturer",
    "mdl": "model",
    "mdl_id": "model_id",
    "hw": "hw_version",
    "sw": "sw_version",
    "sa": "suggested_area",
    "sn": "serial_number",
}

ORIGIN_ABBREVIATIONS: Final[dict[str, str]] = {
    # mqtt.markdown "Supported abbreviations for origin info".
    "sw": "sw_version",
    "url": "support_url",
}

BASE_TOPIC: Final = "~"
"""mqtt.markdown: a base topic `~` may be set; in options ending with `_topic` a `~` at the
start or end of the value stands for it."""

# ---------------------------------------------------------------------------------------------
# Value checks
# ---------------------------------------------------------------------------------------------


def _string(value: object) -> str | None:
    return None if isinstance(value, str) else f"must be a string, got {value!r}"


def _string_or_null(value: object) -> str | None:
    return (
        None
        if value is None or isinstance(value, str)
        else f"must be a string or null, got {value!r}"
    )


def _boolean(value: object) -> str | None:
    return None if isinstance(value, bool) else f"must be a boolean, got {value!r}"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: object) -> str | None:
    return None if _is_number(value) else f"must be a number, got {value!r}"


def _non_negative_integer(value: object) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return None
    return f"must be an integer >= 0, got {value!r}"


def _one_of(*choices: str) -> Check:
    def check(value: object) -> str | None:
        return None if value in choices else f"must be one of {list(choices)}, got {value!r}"

    return check


def _string_list(value: object) -> str | None:
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return None
    return f"must be a list of strings, got {value!r}"


def _subscribe_topic(value: object) -> str | None:
    # A topic HA subscribes to: a non-empty string (wildcards are legal in subscriptions).
    if isinstance(value, str) and value and "\0" not in value:
        return None
    return f"must be a non-empty topic string, got {value!r}"


def _publish_topic(value: object) -> str | None:
    # A topic HA publishes to: no wildcards (MQTT spec; core util.valid_publish_topic).
    if (reason := _subscribe_topic(value)) is not None:
        return reason
    if isinstance(value, str) and ("+" in value or "#" in value):
        return f"must not contain the wildcards '+' or '#', got {value!r}"
    return None


def _qos(value: object) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1, 2):
        return None
    return f"must be 0, 1 or 2, got {value!r}"


def _icon(value: object) -> str | None:
    # Pages: type icon ("mdi:..."); core cv.icon wants "prefix:name".
    if isinstance(value, str) and ":" in value:
        return None
    return f"must be an icon string like 'mdi:name', got {value!r}"


def _regex(value: object) -> str | None:
    # text page, `pattern`: "A valid regular expression"; core cv.is_regex compiles it.
    if not isinstance(value, str):
        return _string(value)
    try:
        re.compile(value)
    except re.error as error:
        return f"must be a valid regular expression ({error})"
    return None


_COMMON_CHECKS: Final[dict[str, Check]] = {
    "availability_mode": _one_of("all", "any", "latest"),  # every page, default latest
    "availability_template": _string,
    "availability_topic": _subscribe_topic,
    "payload_available": _string,  # pages: type string, default "online"
    "payload_not_available": _string,  # pages: type string, default "offline"
    "unique_id": _string,
    "name": _string_or_null,  # pages: "Can be set to `null` if only the device name is relevant"
    "icon": _icon,
    # Pages link to the developer docs' entity categories; HA's EntityCategory has these two
    # (button page example: "config"; sensor page: "diagnostic").
    "entity_category": _one_of("config", "diagnostic"),
    "entity_picture": _string,  # pages: "Picture URL for the entity" (core: cv.url)
    "enabled_by_default": _boolean,
    "object_id": _string,
    "default_entity_id": _string,  # prefix checked in _context_problems
    "json_attributes_topic": _subscribe_topic,
    "json_attributes_template": _string,
    "qos": _qos,
    "encoding": _string,
    "platform": _string,  # value checked in _context_problems
}

_SHARED_PLATFORM_CHECKS: Final[dict[str, Check]] = {
    "command_topic": _publish_topic,
    "command_template": _string,
    "state_topic": _subscribe_topic,
    "value_template": _string,
    "retain": _boolean,
    "optimistic": _boolean,
    "device_class": _string_or_null,  # pages: "The `device_class` can be `null`"
}

_PLATFORM_CHECKS: Final[dict[str, dict[str, Check]]] = {
    "notify": {},
    "text": {
        "min": _non_negative_integer,  # page: integer, default 0; core cv.positive_int
        "max": _non_negative_integer,  # page: integer, default 255
        "mode": _one_of("text", "password"),  # page: "Must be either `text` or `password`"
        "pattern": _regex,
    },
    "button": {"payload_press": _string},  # page: default "PRESS"
    "number": {
        "min": _number,  # page: float, default 1
        "max": _number,  # page: float, default 100
        "step": _number,  # page: float, default 1
        "mode": _one_of("auto", "box", "slider"),  # page: `box` or `slider`, default "auto"
        "unit_of_measurement": _string_or_null,  # page: "can be `null`"
        "payload_reset": _string,  # page: default "None"
    },
    "select": {"options": _string_list},  # page: list; select options are strings
    "sensor": {
        "state_class": _string,
        "unit_of_measurement": _string_or_null,  # page: "can be `null`"
        "suggested_display_precision": _non_negative_integer,  # page: integer
        "expire_after": _non_negative_integer,  # page: integer (seconds), default 0
        "force_update": _boolean,
        "last_reset_value_template": _string,
        "options": _string_list,
    },
    "update": {
        "latest_version_topic": _subscribe_topic,
        "latest_version_template": _string,
        "payload_install": _string,
        "display_precision": _non_negative_integer,  # page: integer, default 0
        "title": _string,
        "release_summary": _string,
        "release_url": _string,
    },
}


def _checks_for(platform: str) -> dict[str, Check]:
    return {**_COMMON_CHECKS, **_SHARED_PLATFORM_CHECKS, **_PLATFORM_CHECKS[platform]}


def _verify_tables() -> None:
    """Every allowed key has a check (or a nested check); fail at import if the tables drift."""
    nested = {"availability", "device", "origin"}
    for platform, keys in PLATFORM_KEYS.items():
        checks = _checks_for(platform)
        unchecked = sorted((COMMON_KEYS | keys) - checks.keys() - nested)
        if unchecked:
            msg = f"ha_schema: no value check for {platform} keys {unchecked}"
            raise RuntimeError(msg)
    if PLATFORM_KEYS.keys() != REQUIRED_KEYS.keys():
        msg = "ha_schema: PLATFORM_KEYS and REQUIRED_KEYS cover different platforms"
        raise RuntimeError(msg)


_verify_tables()

# ---------------------------------------------------------------------------------------------
# Nested maps: availability, device, origin
# ---------------------------------------------------------------------------------------------


def _availability_problems(value: object) -> list[str]:
    # Pages: `availability` is a list; each entry needs `topic` (required: true).
    if not isinstance(value, list):
        return [f"availability: must be a list of maps, got {value!r}"]
    found: list[str] = []
    for index, entry in enumerate(value):
        where = f"availability[{index}]"
        if not isinstance(entry, Mapping):
            found.append(f"{where}: must be a map with a `topic`, got {entry!r}")
            continue
        found.extend(
            f"{where}.{key}: not an availability option"
            for key in _unknown(entry, AVAILABILITY_ENTRY_KEYS)
        )
        if "topic" not in entry:
            found.append(f"{where}.topic: missing (required)")
        else:
            found.extend(_reason(f"{where}.topic", _subscribe_topic(entry["topic"])))
        for key in ("payload_available", "payload_not_available", "value_template"):
            if key in entry:
                found.extend(_reason(f"{where}.{key}", _string(entry[key])))
    return found


def _identifier_problems(device: Mapping[object, object]) -> list[str]:
    found: list[str] = []
    identifiers = device.get("identifiers")
    connections = device.get("connections")
    if identifiers is not None and not (
        isinstance(identifiers, str) or _string_list(identifiers) is None
    ):
        found.append(
            f"device.identifiers: must be a string or a list of strings, got {identifiers!r}"
        )
    if connections is not None and not (
        isinstance(connections, list)
        and all(
            isinstance(pair, list | tuple)
            and len(pair) == 2
            and all(isinstance(part, str) for part in pair)
            for pair in connections
        )
    ):
        found.append(
            "device.connections: must be a list of [connection_type, connection_identifier] "
            f"pairs, got {connections!r}"
        )
    # Pages: "At least one of identifiers or connections must be present to identify the device."
    if not identifiers and not connections:
        found.append("device: needs at least one of `identifiers` or `connections`")
    return found


def _device_problems(value: object) -> list[str]:
    if not isinstance(value, Mapping):
        return [f"device: must be a map, got {value!r}"]
    found = [f"device.{key}: not a device option" for key in _unknown(value, DEVICE_KEYS)]
    found.extend(_identifier_problems(value))
    for key in sorted(DEVICE_KEYS - {"identifiers", "connections"}):
        if key in value:
            found.extend(_reason(f"device.{key}", _string(value[key])))
    url = value.get("configuration_url")
    # Pages: "Can be either an `http://`, `https://` or an internal `homeassistant://` URL."
    if isinstance(url, str) and not url.startswith(("http://", "https://", "homeassistant://")):
        found.append(
            "device.configuration_url: must start with http://, https:// or homeassistant://, "
            f"got {url!r}"
        )
    return found


def _origin_problems(value: object) -> list[str]:
    if not isinstance(value, Mapping):
        return [f"origin: must be a map, got {value!r}"]
    found = [f"origin.{key}: not an origin option" for key in _unknown(value, ORIGIN_KEYS)]
    if "name" not in value:
        found.append("origin.name: missing (required)")
    for key in sorted(ORIGIN_KEYS):
        if key in value:
            found.extend(_reason(f"origin.{key}", _string(value[key])))
    return found


_NESTED_CHECKS: Final[dict[str, Callable[[object], list[str]]]] = {
    "availability": _availability_problems,
    "device": _device_problems,
    "origin": _origin_problems,
}

# ---------------------------------------------------------------------------------------------
# Per-platform rules between options
# ---------------------------------------------------------------------------------------------


def _text_rules(config: Mapping[str, object], source_checks: bool) -> list[str]:
    found: list[str] = []
    low, high = config.get("min", 0), config.get("max", TEXT_MAX_LIMIT)
    if isinstance(high, int) and high > TEXT_MAX_LIMIT:
        found.append(f"max: {high} is above the text limit of {TEXT_MAX_LIMIT} (docs)")
    if source_checks and isinstance(low, int) and isinstance(high, int):
        if low > high:
            found.append(f"min: {low} is above max {high} (core text.py)")
        elif low == high:
            found.append(f"min: equals max {high}; older core text.py rejects min >= max (core)")
    return found


def _number_rules(config: Mapping[str, object], source_checks: bool) -> list[str]:
    found: list[str] = []
    step = config.get("step")
    if _is_number(step) and isinstance(step, int | float) and step < NUMBER_STEP_MIN:
        found.append(f"step: {step} is below the smallest step {NUMBER_STEP_MIN} (docs)")
    low, high = config.get("min"), config.get("max")
    if (
        source_checks
        and isinstance(low, int | float)
        and isinstance(high, int | float)
        and low >= high
    ):
        found.append(f"max: {high} must be above min {low} (core number.py validate_config)")
    return found


def _sensor_rules(config: Mapping[str, object], _source_checks: bool) -> list[str]:
    found: list[str] = []
    # Sensor page, `entity_category`: "When set, the entity category must be `diagnostic`".
    if "entity_category" in config and config["entity_category"] != "diagnostic":
        found.append("entity_category: must be `diagnostic` for sensors (docs)")
    # Sensor page, `options`: "An empty list is not allowed. The sensor's `device_class` must
    # be set to `enum`. ... cannot be used together with `state_class` or `unit_of_measurement`."
    if "options" in config:
        if config["options"] == []:
            found.append("options: an empty list is not allowed (docs)")
        if config.get("device_class") != "enum":
            found.append("options: needs device_class `enum` (docs)")
        found.extend(
            f"options: cannot be used together with `{other}` (docs)"
            for other in ("state_class", "unit_of_measurement")
            if config.get(other) is not None
        )
    # Sensor page, `last_reset_value_template`: "the `state_class` option must be `total`".
    if "last_reset_value_template" in config and config.get("state_class") != "total":
        found.append("last_reset_value_template: needs state_class `total` (docs)")
    return found


def _update_rules(config: Mapping[str, object], source_checks: bool) -> list[str]:
    found: list[str] = []
    summary = config.get("release_summary")
    if isinstance(summary, str) and len(summary) > RELEASE_SUMMARY_MAX:
        found.append(
            f"release_summary: {len(summary)} characters, max {RELEASE_SUMMARY_MAX} (docs)"
        )
    # Core update.py async_install publishes self._config[CONF_PAYLOAD_INSTALL], which has no
    # default: an install from HA would fail without it. (The page gives no default either.)
    if source_checks and "command_topic" in config and "payload_install" not in config:
        found.append(
            "payload_install: missing although command_topic is set; core has no default (core)"
        )
    return found


def _no_rules(_config: Mapping[str, object], _source_checks: bool) -> list[str]:
    return []


_PLATFORM_RULES: Final[dict[str, Callable[[Mapping[str, object], bool], list[str]]]] = {
    "notify": _no_rules,
    "text": _text_rules,
    "button": _no_rules,
    "number": _number_rules,
    "select": _no_rules,  # page: "An empty list or a list with a single item is allowed."
    "sensor": _sensor_rules,
    "update": _update_rules,
}

# ---------------------------------------------------------------------------------------------
# Public checks
# ---------------------------------------------------------------------------------------------


def allowed_keys(platform: str) -> frozenset[str]:
    """Every key the documentation allows in a `platform` entity config."""
    return COMMON_KEYS | PLATFORM_KEYS[platform]


def problems(
    platform: str,
    config: Mapping[str, object],
    *,
    device_discovery: bool = False,
    source_checks: bool = True,
) -> list[str]:
    """Everything wrong with one discovery config for `platform`; empty when it is valid.

    Reports keys the platform does not document, missing required keys, unknown or badly typed
    `device`/`origin`/`availability` entries, and value problems the documentation states.
    `device_discovery=True` checks a component of a device-based payload (after the root's
    shared options are merged in): `platform` and `unique_id` are then required, and `device`
    belongs to the root. With `source_checks` (default) it also reports what core's schema
    rejects although the documentation allows it; those messages end with "(core)".
    """
    if platform not in PLATFORM_KEYS:
        return [f"platform {platform!r} is not covered (covered: {sorted(PLATFORM_KEYS)})"]
    found = [
        f"{key}: not a documented {platform} option"
        + (" (core accepts it)" if key in _source_only(platform) else "")
        for key in _unknown(config, allowed_keys(platform) | {BASE_TOPIC})
    ]
    found.extend(
        _missing(platform, config, device_discovery=device_discovery, source_checks=source_checks)
    )
    checks = _checks_for(platform)
    for key in sorted(config.keys() & allowed_keys(platform)):
        if key in _NESTED_CHECKS:
            found.extend(_NESTED_CHECKS[key](config[key]))
        else:
            found.extend(_reason(key, checks[key](config[key])))
    found.extend(_context_problems(platform, config, device_discovery=device_discovery))
    found.extend(_PLATFORM_RULES[platform](config, source_checks))
    return found


def device_discovery_problems(
    payload: Mapping[str, object], *, source_checks: bool = True
) -> list[str]:
    """Everything wrong with a device-based discovery payload (`<prefix>/device/<id>/config`).

    mqtt.markdown "Device discovery payload": the root must carry `device` and `origin` (they
    "cannot be overridden at the entity/component level"), `components` maps component IDs to
    configs each with a `platform`, and the root may set the shared options. A component with
    only `platform` removes that component and is not checked further. Components of platforms
    this schema does not cover are reported as such.
    """
    if dict(payload) == {"migrate_discovery": True}:
        return []  # mqtt.markdown: the migration / rollback message
    root_allowed = DEVICE_DISCOVERY_SHARED_KEYS | {"device", "origin", "components"}
    found = [
        f"{key}: not a device discovery root option"
        + (" (core: `~` is applied per component)" if key == BASE_TOPIC else "")
        for key in _unknown(payload, root_allowed)
    ]
    for key in ("device", "origin", "components"):
        if key not in payload:
            found.append(f"{key}: missing (required in device-based discovery)")
    found.extend(_device_problems(payload["device"]) if "device" in payload else [])
    found.extend(_origin_problems(payload["origin"]) if "origin" in payload else [])
    components = payload.get("components", {})
    if not isinstance(components, Mapping):
        return [*found, f"components: must be a map of component configs, got {components!r}"]
    shared = {key: payload[key] for key in DEVICE_DISCOVERY_SHARED_KEYS if key in payload}
    for component_id, component in components.items():
        found.extend(
            f"components.{component_id}: {problem}"
            for problem in _component_problems(component, shared, source_checks=source_checks)
        )
    return found


def update_state_problems(payload: Mapping[str, object]) -> list[str]:
    """Everything wrong with a JSON state payload for an update entity's `state_topic`.

    update.mqtt.markdown: the payload is either a plain `installed_version` string (not checked
    here) or a JSON object whose keys are all optional: the version, title, summary, URL and
    picture strings, `in_progress` (boolean) and `update_percentage` (0 to 100; `null` resets).
    """
    found = [f"{key}: not an update state key" for key in _unknown(payload, UPDATE_STATE_KEYS)]
    for key in sorted(UPDATE_STATE_KEYS - {"in_progress", "update_percentage"}):
        if key in payload:
            found.extend(_reason(key, _string(payload[key])))
    summary = payload.get("release_summary")
    if isinstance(summary, str) and len(summary) > RELEASE_SUMMARY_MAX:
        # The page gives the 255 limit on the config option of the same name.
        found.append(f"release_summary: {len(summary)} characters, max {RELEASE_SUMMARY_MAX}")
    if "in_progress" in payload:
        found.extend(_reason("in_progress", _boolean(payload["in_progress"])))
    if "update_percentage" in payload:
        percentage = payload["update_percentage"]
        if percentage is not None and not (
            isinstance(percentage, int | float)
            and not isinstance(percentage, bool)
            and 0 <= percentage <= 100
        ):
            found.append(
                f"update_percentage: must be a number from 0 to 100 or null, got {percentage!r}"
            )
    return found


def expand_abbreviations(config: Mapping[str, object]) -> dict[str, object]:
    """`config` with documented abbreviations expanded and the `~` base topic substituted.

    Expands entity keys, `device` and `origin` keys, `availability` entries and, in a device
    payload, each component. Keys without a known abbreviation are kept as they are.

    `~` (mqtt.markdown "Discovery payload") is substituted where core's discovery does it: per
    entity or component payload, at the start or end of options ending in `topic` and of
    `availability[].topic`. At the root of a device payload (one with `components`) it is left
    in place: core applies `~` per component, and DEVICE_DISCOVERY_SCHEMA does not allow it.
    """
    expanded: dict[str, object] = {}
    for key, value in config.items():
        name = ABBREVIATIONS.get(key, key)
        if name == "device" and isinstance(value, Mapping):
            expanded[name] = {DEVICE_ABBREVIATIONS.get(k, k): v for k, v in value.items()}
        elif name == "origin" and isinstance(value, Mapping):
            expanded[name] = {ORIGIN_ABBREVIATIONS.get(k, k): v for k, v in value.items()}
        elif name == "availability" and isinstance(value, list):
            expanded[name] = [
                {ABBREVIATIONS.get(k, k): v for k, v in entry.items()}
                if isinstance(entry, Mapping)
                else entry
                for entry in value
            ]
        elif name == "components" and isinstance(value, Mapping):
            expanded[name] = {
                cid: expand_abbreviations(part) if isinstance(part, Mapping) else part
                for cid, part in value.items()
            }
        else:
            expanded[name] = value
    if "components" not in expanded and isinstance(base := expanded.get(BASE_TOPIC), str):
        del expanded[BASE_TOPIC]
        _substitute_base_topic(expanded, base)
    return expanded


def _with_base(value: object, base: str) -> object:
    if isinstance(value, str) and value.startswith(BASE_TOPIC):
        return base + value[1:]
    if isinstance(value, str) and value.endswith(BASE_TOPIC):
        return value[:-1] + base
    return value


def _substitute_base_topic(config: dict[str, object], base: str) -> None:
    for key, value in config.items():
        if key.endswith("topic"):
            config[key] = _with_base(value, base)
    availability = config.get("availability")
    if isinstance(availability, list):
        config["availability"] = [
            {**entry, "topic": _with_base(entry["topic"], base)}
            if isinstance(entry, Mapping) and "topic" in entry
            else entry
            for entry in availability
        ]


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _unknown(keys: Iterable[object], allowed: frozenset[str]) -> list[str]:
    return sorted(str(key) for key in keys if key not in allowed)


def _reason(where: str, reason: str | None) -> list[str]:
    return [] if reason is None else [f"{where}: {reason}"]


def _source_only(platform: str) -> frozenset[str]:
    return SOURCE_ONLY_KEYS.get(platform, frozenset()) | SOURCE_ONLY_KEYS["*"]


def _missing(
    platform: str, config: Mapping[str, object], *, device_discovery: bool, source_checks: bool
) -> list[str]:
    required = REQUIRED_KEYS[platform] | (
        DEVICE_DISCOVERY_REQUIRED_KEYS if device_discovery else frozenset()
    )
    found = [f"{key}: missing (required)" for key in sorted(required - config.keys())]
    if source_checks:
        core_only = SOURCE_REQUIRED_KEYS.get(platform, frozenset()) - required - config.keys()
        found.extend(
            f"{key}: missing; docs say optional but core requires it (core)"
            for key in sorted(core_only)
        )
    return found


def _context_problems(
    platform: str, config: Mapping[str, object], *, device_discovery: bool
) -> list[str]:
    found: list[str] = []
    if "platform" in config:
        if not device_discovery:
            found.append(
                "platform: only allowed in a device-based discovery component (docs; "
                "single-component discovery drops it)"
            )
        elif config["platform"] != platform:
            found.append(f"platform: must be {platform!r}, got {config['platform']!r}")
    if "availability" in config and "availability_topic" in config:
        found.append("availability: must not be used together with availability_topic (docs)")
    if "device" in config and "unique_id" not in config and not device_discovery:
        found.append("device: only used when unique_id is set (docs)")
    entity_id = config.get("default_entity_id")
    if isinstance(entity_id, str) and not entity_id.startswith(f"{platform}."):
        found.append(
            f"default_entity_id: must be a full entity ID like '{platform}.foobar', "
            f"got {entity_id!r}"
        )
    return found


def _component_problems(
    component: object, shared: Mapping[str, object], *, source_checks: bool
) -> list[str]:
    if not isinstance(component, Mapping):
        return [f"must be a map, got {component!r}"]
    platform = component.get("platform")
    if platform is None:
        return ["platform: missing (required)"]
    if not isinstance(platform, str) or platform not in PLATFORM_KEYS:
        return [f"platform {platform!r} is not covered by this schema"]
    if set(component.keys()) == {"platform"}:
        return []  # removal of this component
    found = [
        f"{key}: belongs at the root of a device discovery payload, not in a component"
        for key in ("device", "origin")
        if key in component
    ]
    merged: dict[str, object] = {**shared, **{str(k): v for k, v in component.items()}}
    merged.pop("device", None)
    merged.pop("origin", None)
    found.extend(problems(platform, merged, device_discovery=True, source_checks=source_checks))
    return found
