#!/usr/bin/env bash
# `sudo make install`: the agent installed the way it runs in production (docs/raspberry-pi.md):
#   the system packages it needs (the `install` ones of scripts/system-packages.txt)
#   the service user `voice-agent` (groups voice-agent and audio)
#   /opt/voice-agent/venv: this tree and its dependencies, no extras (`pip install`, not editable)
#   /usr/local/bin/voice-agent: the venv's command on the PATH
#   /etc/voice-agent/agent.yaml: config/agent.yaml, unless the file is there already (kept)
#   /etc/systemd/system/voice-agent.service: config/voice-agent.service (the hardened unit)
#   /var/cache/voice-agent: the voice's graph analysis, done now (`voice-agent prepare`)
#   systemd: the unit enabled and (re)started where systemd runs
# Run it again to upgrade: the venv is reinstalled from this tree, the configuration kept.
# `sudo make uninstall` undoes it (scripts/uninstall.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX=/opt/voice-agent  # the unit's WorkingDirectory and ExecStart name it
VENV="$PREFIX/venv"
CONFIG_DIR=/etc/voice-agent
UNIT=/etc/systemd/system/voice-agent.service
CACHE=/var/cache/voice-agent  # the unit's CacheDirectory=
STATE=/var/lib/voice-agent    # and StateDirectory=
USER_NAME=voice-agent
LINK=/usr/local/bin/voice-agent

if [ "$(id -u)" -ne 0 ]; then
  echo "The install writes to /opt, /etc and /var: run it as root (sudo make install)." >&2
  exit 1
fi

mapfile -t PACKAGES < <(awk '!/^#/ && NF && ("," $2 ",") ~ /,install,/ { print $1 }' \
  scripts/system-packages.txt)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "Installing system packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "Python 3.11 or newer is needed (found $(python3 --version))." >&2
  exit 1
}

if ! getent passwd "$USER_NAME" >/dev/null; then
  echo "Adding the service user $USER_NAME"
  useradd --system --user-group --home-dir "$PREFIX" --no-create-home \
    --shell /usr/sbin/nologin --comment "voice-agent service" "$USER_NAME"
fi
getent group audio >/dev/null || groupadd --system audio
usermod --append --groups audio "$USER_NAME"

echo "Installing the agent into $VENV"
install -d -m 0755 "$PREFIX"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# Built from a copy: pip would write build files into this tree as root.
SOURCE="$(mktemp -d)"
trap 'rm -rf "$SOURCE"' EXIT
tar -cf - --exclude=./.git --exclude=./.venv --exclude=./.cache --exclude=./.run \
  --exclude=./site --exclude=./build --exclude='*.egg-info' --exclude=__pycache__ . |
  tar -xf - -C "$SOURCE"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "$SOURCE"
ln -sfn "$VENV/bin/voice-agent" "$LINK"

install -d -m 0755 "$CONFIG_DIR"
if [ -e "$CONFIG_DIR/agent.yaml" ]; then
  echo "Keeping $CONFIG_DIR/agent.yaml"
else
  install -m 0644 config/agent.yaml "$CONFIG_DIR/agent.yaml"
  echo "Wrote $CONFIG_DIR/agent.yaml (every key at its default: set node_id and mqtt there)"
fi
runuser -u "$USER_NAME" -- "$VENV/bin/voice-agent" check-config "$CONFIG_DIR/agent.yaml"

install -m 0644 config/voice-agent.service "$UNIT"
# The directories systemd makes for the unit (the same owner and mode), made now so that the
# voice is prepared where the service will look, as its user.
install -d -m 0700 -o "$USER_NAME" -g "$USER_NAME" "$CACHE" "$STATE"
echo "Preparing the voice (its graph analysis, once: ~20 s on 2 x86 cores, minutes on a Pi)"
(
  cd "$PREFIX"
  umask 0077
  runuser -u "$USER_NAME" -- env -i PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
    HOME="$PREFIX" CACHE_DIRECTORY="$CACHE" STATE_DIRECTORY="$STATE" \
    "$VENV/bin/voice-agent" prepare --config "$CONFIG_DIR/agent.yaml"
)

if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl daemon-reload
  systemctl enable voice-agent.service
  systemctl restart voice-agent.service
  echo "Installed and started: systemctl status voice-agent; journalctl -u voice-agent -f"
elif command -v systemctl >/dev/null; then
  systemctl enable voice-agent.service
  echo "Installed and enabled; systemd is not running here, so it starts at the next boot."
else
  echo "Installed. systemd is not running here (a container or chroot), so nothing starts it;"
  echo "run it as the unit would with:  sudo python3 scripts/run_unit.py $UNIT"
fi
echo "Configuration: $CONFIG_DIR/agent.yaml (then: sudo systemctl restart voice-agent)"
