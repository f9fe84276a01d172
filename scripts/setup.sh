#!/usr/bin/env bash
# One-time setup for `make run` and `make test` on Debian 12 / Raspberry Pi OS:
# system packages (when root or passwordless sudo allows), then .venv with the Python packages.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
SYSTEM_PACKAGES=(mosquitto mosquitto-clients libasound2-dev alsa-utils gcc)
# The tests also pace playback in real time through PulseAudio's null sink (ALSA `pulse`).
TEST_PACKAGES=(pulseaudio libasound2-plugins)
[ "${WITH_TEST_PACKAGES:-1}" = 1 ] && SYSTEM_PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for pkg in "${SYSTEM_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then missing+=(python3-venv); fi
if ! "$PYTHON" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  missing+=(python3-dev)
fi

if ((${#missing[@]})); then
  if [ "$(id -u)" -eq 0 ]; then SUDO=(); elif sudo -n true 2>/dev/null; then SUDO=(sudo -n); else SUDO=(none); fi
  if [ "${SUDO[0]:-}" = none ]; then
    echo "Missing system packages: ${missing[*]}" >&2
    echo "Install them with:  sudo apt-get install -y ${missing[*]}   then run make again." >&2
    exit 1
  fi
  echo "Installing system packages: ${missing[*]}"
  "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${missing[@]}"
fi

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "Python 3.11 or newer is needed (found $("$PYTHON" --version))." >&2
  exit 1
}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet --editable '.[dev]'
touch .venv/.installed
echo "Setup done: .venv is ready."
