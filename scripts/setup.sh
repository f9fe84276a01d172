#!/usr/bin/env bash
# One-time setup for `make run` and `make test` on Debian 12 / Raspberry Pi OS:
# system packages (when root or passwordless sudo allows), then .venv with the Python packages.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
# The one list of system packages (also .ci/run's): scripts/system-packages.txt.
LIST=scripts/system-packages.txt
packages_of() {  # the packages of these kinds (run, test, python)
  awk -v kinds=" $* " '!/^#/ && NF && index(kinds, " " $2 " ") { print $1 }' "$LIST"
}
kinds=(run)
# The tests also need theirs (PulseAudio's null sink, bubblewrap, systemd-analyze, openssl...).
[ "${WITH_TEST_PACKAGES:-1}" = 1 ] && kinds+=(test)
mapfile -t SYSTEM_PACKAGES < <(packages_of "${kinds[@]}")

missing=()
for pkg in "${SYSTEM_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
# The venv and headers of the Python that builds .venv: checked on that Python (a pyenv one has
# its own), the package named in the list when it lacks them.
python_package() { packages_of python | grep -x "$1"; }
if ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then missing+=("$(python_package python3-venv)"); fi
if ! "$PYTHON" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  missing+=("$(python_package python3-dev)")
fi

if ((${#missing[@]})); then
  if [ "$(id -u)" -eq 0 ]; then SUDO=(); elif sudo -n true 2>/dev/null; then SUDO=(sudo -n); else SUDO=(none); fi
  if [ "${SUDO[0]:-}" = none ]; then
    echo "Missing system packages: ${missing[*]}" >&2
    echo "Install them with:  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    echo "then run make again." >&2
    exit 1
  fi
  echo "Installing system packages: ${missing[*]}"
  "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
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
