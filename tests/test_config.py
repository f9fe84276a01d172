"""Configuration: defaults, all problems reported at once with key paths, env overrides, docs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.settings import declarations as cfg
from agent.settings import loading
from agent.settings.declarations import ConfigError, key_docs
from agent.settings.loading import from_mapping, load
from harness import ROOT


def test_default_file_loads_and_matches_the_dataclass_defaults() -> None:
    loaded = load(loading.DEFAULT_CONFIG_PATH, environ={}, hostname=lambda: "pi.local")
    assert loaded == from_mapping({}, environ={}, hostname=lambda: "pi.local")
    assert loaded.node_id == "pi-local"
    assert loaded.mqtt.topic_prefix == "voice"
    assert loaded.audio.device == "default"
    assert loaded.tts.voice is None


def test_default_file_documents_every_key_and_nothing_else() -> None:
    raw = yaml.safe_load(loading.DEFAULT_CONFIG_PATH.read_text(encoding="utf-8"))

    def leaves(node: dict[str, object], prefix: str = "") -> set[str]:
        out: set[str] = set()
        for key, value in node.items():
            if isinstance(value, dict) and value:  # an empty map is a key's value
                out |= leaves(value, f"{prefix}{key}.")
            else:
                out.add(f"{prefix}{key}")
        return out

    assert leaves(raw) == set(key_docs())
    text = loading.DEFAULT_CONFIG_PATH.read_text(encoding="utf-8")
    for path in key_docs():
        leaf = path.rsplit(".", 1)[-1]
        # every key is preceded by a comment line explaining it
        assert re.search(rf"#.*\n\s*{leaf}:", text), path


def test_the_config_reference_lists_every_key() -> None:
    reference = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [path for path in key_docs() if f"`{path}`" not in reference]
    assert not missing


def test_three_mistakes_are_reported_together_with_key_paths() -> None:
    raw = {"node_id": "bad id!", "mqtt": {"port": "abc"}, "tts": {"threads": -1}}
    with pytest.raises(ConfigError) as caught:
        from_mapping(raw, "test.yaml", environ={})
    message = str(caught.value)
    assert "3 problems" in message
    for path in ("node_id", "mqtt.port", "tts.threads"):
        assert f"  - {path}: " in message, message


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"mqtt": {"hots": "x"}}, "mqtt.hots: unknown key"),
        ({"mqtt": "broker"}, "mqtt: expected a mapping"),
        ({"mqtt": {"port": 70000}}, "mqtt.port: expected a value from 1 to 65535"),
        ({"mqtt": {"port": True}}, "mqtt.port: expected an integer"),
        ({"mqtt": {"topic_prefix": "a/#"}}, "mqtt.topic_prefix: expected a topic without"),
        ({"mqtt": {"password_file": "/nonexistent/pw"}}, "mqtt.password_file: no readable file"),
        ({"node_id": "all"}, "node_id: 'all' is reserved"),
        ({"tts": {"voice": "/nonexistent.onnx"}}, "tts.voice: no such model file"),
        ({"audio": {"device": None}}, "audio.device: expected a string, got null"),
        ({"speak": {"queue_size": 0}}, "speak.queue_size: expected a value from 1"),
    ],
)
def test_each_kind_of_mistake_names_its_key(raw: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_mapping(raw, environ={})
    assert problem in str(caught.value)


def test_voice_without_its_json_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "v.onnx"
    model.write_bytes(b"onnx")
    with pytest.raises(ConfigError, match=r"tts.voice: the voice config .*v.onnx.json is missing"):
        from_mapping({"tts": {"voice": str(model)}}, environ={})


def test_environment_overrides_deployment_values(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    env = {
        "VOICE_AGENT_MQTT_HOST": "broker.lan",
        "VOICE_AGENT_MQTT_PORT": "8883",
        "VOICE_AGENT_MQTT_USERNAME": "pi",
        "VOICE_AGENT_MQTT_PASSWORD_FILE": str(secret),
        "VOICE_AGENT_NODE_ID": "kitchen",
        "VOICE_AGENT_AUDIO_DEVICE": "plughw:1,0",
    }
    raw = {"mqtt": {"host": "ignored", "tls": {"enabled": True}}}  # a password needs TLS
    loaded = from_mapping(raw, environ=env)
    assert (loaded.mqtt.host, loaded.mqtt.port, loaded.mqtt.username) == ("broker.lan", 8883, "pi")
    assert loaded.mqtt.password_file == secret
    assert (loaded.node_id, loaded.audio.device) == ("kitchen", "plughw:1,0")


def test_a_bad_environment_value_names_its_variable() -> None:
    with pytest.raises(ConfigError, match=r"mqtt.port \(from \$VOICE_AGENT_MQTT_PORT\)"):
        from_mapping({}, environ={"VOICE_AGENT_MQTT_PORT": "eighty"})


def test_yaml_syntax_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("mqtt: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(broken, environ={})
    with pytest.raises(ConfigError, match="cannot read the file"):
        load(tmp_path / "absent.yaml", environ={})


def test_cache_dir_resolution() -> None:
    section = cfg.CacheConfig()
    assert loading.resolve_cache_dir(section, {"CACHE_DIRECTORY": "/var/cache/va"}) == Path(
        "/var/cache/va"
    )
    assert loading.resolve_cache_dir(section, {"XDG_CACHE_HOME": "/x"}) == Path("/x/voice-agent")
    assert loading.resolve_cache_dir(cfg.CacheConfig(dir=Path("/c")), {}) == Path("/c")


def test_check_config_cli_exits_non_zero_naming_all_three_paths(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("node_id: 'a b'\nmqtt:\n  port: abc\ntts:\n  threads: 999\n")
    result = subprocess.run(
        [sys.executable, "-m", "agent", "check-config", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    for path in ("node_id", "mqtt.port", "tts.threads"):
        assert f"- {path}:" in result.stderr
    good = subprocess.run(
        [sys.executable, "-m", "agent", "check-config", str(loading.DEFAULT_CONFIG_PATH)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert good.returncode == 0, good.stderr


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        (
            "audio:\n  alarm_volume_floor: 1" + "0" * 400 + "\n  period_ms: 1" + "0" * 400 + "\n",
            ["audio.period_ms: expected a value from 2 to 20", "audio.alarm_volume_floor"],
        ),
        ("audio:\n  period_ms: 1" + "0" * 5000 + "\n", ["a number of thousands of digits"]),
        ("speak:\n  queue_size: " + "[" * 5000 + "]" * 5000 + "\n", ["nested too deeply"]),
        ("audio:\n  volume: .nan\n  alarm_volume_floor: -.inf\n", ["audio.volume", "floor"]),
    ],
    ids=["400-digit numbers", "5000-digit number", "5000 nested lists", "nan and inf"],
)
def test_hostile_numbers_and_depth_are_config_problems_not_tracebacks(
    tmp_path: Path, text: str, problems: list[str]
) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load(path, environ={})
    message = str(caught.value)
    assert all(p in message for p in problems), message
    assert max(len(line) for line in message.splitlines()) < 200  # a huge value is cut short


def test_every_bad_host_entry_is_reported_with_its_key_path() -> None:
    raw = {
        "audio": {"media_hosts": ["ha.local:8123", "192.168.1.5/24", "127.1", 5, "ha.local:0"]},
        "ota": {"hosts": "releases.example.com"},
    }
    with pytest.raises(ConfigError) as caught:
        from_mapping(raw, "test.yaml", environ={})
    message = str(caught.value)
    print(message)
    assert "5 problems" in message, message
    for path, problem in [
        ("audio.media_hosts[1]", "host bits set: the network is 192.168.1.0/24"),
        (
            "audio.media_hosts[2]",
            "an IPv4 address in a short or numeric form: write it as 127.0.0.1",
        ),
        ("audio.media_hosts[3]", "expected a string, got int 5"),
        ("audio.media_hosts[4]", "expected a port from 1 to 65535, or * for any"),
        ("ota.hosts", "expected a list, got str"),
    ]:
        assert f"  - {path}: {problem}" in message, (path, message)
    assert "audio.media_hosts[0]" not in message


def test_host_entries_in_the_documented_syntax_are_taken() -> None:
    raw = {
        "audio": {"media_hosts": ["homeassistant.local:8123", "192.168.1.0/24", "[fd00::/8]:*"]},
        "ota": {"hosts": ["releases.example.com"]},
    }
    config = from_mapping(raw, "test.yaml", environ={})
    assert config.audio.media_hosts == (
        "homeassistant.local:8123",
        "192.168.1.0/24",
        "[fd00::/8]:*",
    )
    assert config.ota.hosts == ("releases.example.com",)
    assert cfg.AudioConfig().media_hosts == ()  # by default, URL sounds are off
    assert cfg.OtaConfig().hosts == ()


def test_mqtt_hosts_are_a_list_of_servers_with_their_ports_filled_in(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here\n")
    raw = {
        "mqtt": {
            "hosts": [
                {"host": "a.plant.lan"},
                {"host": "b.plant.lan", "tls": {"enabled": True, "ca_file": str(ca)}},
                {"host": "c.plant.lan", "port": 1884},
            ],
            "protocol": "3.1.1",
        }
    }
    config = from_mapping(raw, environ={})
    assert [s.address for s in cfg.servers(config.mqtt)] == [
        "a.plant.lan:1883",
        "b.plant.lan:8883",
        "c.plant.lan:1884",
    ]
    assert cfg.servers(config.mqtt)[1].tls == cfg.TlsConfig(enabled=True, ca_file=ca)
    assert config.mqtt.protocol == "3.1.1"


def test_without_hosts_the_one_server_is_host_port_and_tls() -> None:
    config = from_mapping({"mqtt": {"host": "broker.lan", "port": 8883}}, environ={})
    assert config.mqtt.hosts == ()
    assert cfg.servers(config.mqtt) == (cfg.MqttServer("broker.lan", 8883, cfg.TlsConfig()),)
    assert cfg.servers(cfg.MqttConfig()) == (cfg.MqttServer("127.0.0.1", 1883),)


@pytest.mark.parametrize(("value", "taken"), [(5, "5"), ("5", "5"), ("3.1.1", "3.1.1")])
def test_the_protocol_may_be_written_as_yaml_gives_it(value: object, taken: str) -> None:
    assert from_mapping({"mqtt": {"protocol": value}}, environ={}).mqtt.protocol == taken


ENTRY_KEYS = "host, port, tls, username, password_file, allow_plaintext_password"


def test_every_bad_server_entry_is_reported_with_its_index() -> None:
    raw = {
        "mqtt": {
            "protocol": 4,
            "hosts": [
                {"port": 1883},
                {"host": "b", "port": 70000, "tls": {"enabled": "yes"}},
                "c:1883",
                {"host": "d", "colour": "red", "tls": {"ca_file": "/nonexistent/ca.pem"}},
                None,
            ],
        }
    }
    with pytest.raises(ConfigError) as caught:
        from_mapping(raw, "test.yaml", environ={})
    message = str(caught.value)
    for problem in [
        "mqtt.protocol: expected one of auto, 5, 3.1.1, got 4",
        "mqtt.hosts[0].host: missing",
        "mqtt.hosts[1].port: expected a value from 0 to 65535",
        "mqtt.hosts[1].tls.enabled: expected true or false",
        f"mqtt.hosts[2]: expected a mapping of {ENTRY_KEYS}, got str 'c:1883'",
        "mqtt.hosts[3].colour: unknown key",
        "mqtt.hosts[3].tls.ca_file: no readable file",
        f"mqtt.hosts[4]: expected a mapping of {ENTRY_KEYS}, got null",
    ]:
        assert f"  - {problem}" in message, (problem, message)
    assert "8 problems" in message, message
    with pytest.raises(ConfigError, match=r"mqtt.hosts: expected a list, got a mapping"):
        from_mapping({"mqtt": {"hosts": {"host": "a"}}}, environ={})


def test_hosts_and_host_together_are_an_error_naming_both_keys() -> None:
    raw = {"mqtt": {"host": "broker.lan", "port": 1884, "hosts": [{"host": "a"}]}}
    with pytest.raises(ConfigError) as caught:
        from_mapping(raw, "test.yaml", environ={})
    message = str(caught.value)
    assert "  - mqtt.host: set, but mqtt.hosts lists the servers" in message, message
    assert "  - mqtt.port: set, but mqtt.hosts lists the servers" in message, message
    with pytest.raises(ConfigError, match=r"mqtt.host \(from \$VOICE_AGENT_MQTT_HOST\)|mqtt.host:"):
        from_mapping({"mqtt": {"hosts": [{"host": "a"}]}}, environ={"VOICE_AGENT_MQTT_HOST": "b"})


def test_a_servers_tls_files_are_checked_like_mqtt_tls(tmp_path: Path) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("x\n")
    raw = {
        "mqtt": {
            "hosts": [
                {"host": "a"},
                {"host": "b", "tls": {"enabled": True, "cert_file": str(cert)}},
                {"host": "c", "tls": {"ca_file": str(cert)}},
            ]
        }
    }
    with pytest.raises(ConfigError) as caught:
        from_mapping(raw, "test.yaml", environ={})
    message = str(caught.value)
    assert "mqtt.hosts[1].tls.cert_file: a client certificate needs its key_file" in message
    assert "mqtt.hosts[2].tls.enabled: false, but TLS files are set" in message


def test_a_retired_key_starts_with_a_warning_saying_what_took_its_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = from_mapping({"wyoming": {"max_text_chars": 2000}}, "old.yaml", environ={})
    assert config.wyoming is not None
    assert "wyoming.max_text_chars is no longer used: " in caplog.text
    assert "speak.max_text_chars" in caplog.text
    with pytest.raises(ConfigError, match=r"wyoming\.max_text_char: unknown key"):
        from_mapping({"wyoming": {"max_text_char": 2000}}, "typo.yaml", environ={})
