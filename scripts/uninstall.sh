#!/usr/bin/env bash
# `sudo make uninstall`: the inverse of `sudo make install` (scripts/install.sh). The service
# stopped and disabled, its unit, /opt/voice-agent, /usr/local/bin/voice-agent, the cache and
# the state (/var/cache/voice-agent, /var/lib/voice-agent: the journal and installed model
# updates) and the service user removed. The configuration (/etc/voice-agent) is kept unless
# PURGE=1 (`sudo make uninstall PURGE=1`). System packages are left installed.
set -euo pipefail

PREFIX=/opt/voice-agent
CONFIG_DIR=/etc/voice-agent
UNIT=/etc/systemd/system/voice-agent.service
USER_NAME=voice-agent
LINK=/usr/local/bin/voice-agent

if [ "$(id -u)" -ne 0 ]; then
  echo "The uninstall removes files from /opt, /etc and /var: run it as root (sudo make uninstall)." >&2
  exit 1
fi

if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl disable --now voice-agent.service 2>/dev/null || true
elif command -v systemctl >/dev/null; then
  systemctl disable voice-agent.service 2>/dev/null || true
fi
if getent passwd "$USER_NAME" >/dev/null &&
  [ -n "$(find /proc -mindepth 1 -maxdepth 1 -name '[0-9]*' -user "$USER_NAME" 2>/dev/null)" ]; then
  echo "Processes of $USER_NAME still run (the agent started by hand?): stop them first." >&2
  exit 1
fi
rm -f "$UNIT"
[ -d /run/systemd/system ] && command -v systemctl >/dev/null && systemctl daemon-reload
if [ -L "$LINK" ] && [ "$(readlink "$LINK")" = "$PREFIX/venv/bin/voice-agent" ]; then
  rm -f "$LINK"
fi
rm -rf "$PREFIX" /var/cache/voice-agent /var/lib/voice-agent
if getent passwd "$USER_NAME" >/dev/null; then
  userdel "$USER_NAME"
fi
if getent group "$USER_NAME" >/dev/null; then
  groupdel "$USER_NAME"
fi
if [ "${PURGE:-0}" = 1 ]; then
  rm -rf "$CONFIG_DIR"
  echo "Uninstalled, configuration included."
elif [ -d "$CONFIG_DIR" ]; then
  echo "Uninstalled; kept the configuration in $CONFIG_DIR (PURGE=1 removes it too)."
else
  echo "Uninstalled."
fi
