#!/usr/bin/env bash
# Set-up on Debian 12 / Raspberry Pi OS, in two sizes:
#   scripts/setup.sh run    what `make run` needs: the run packages, .venv with the project and
#                           its dependencies (`pip install .`, no extras), the voice prepared
#   scripts/setup.sh test   what `make test` and the other targets need: the run and test
#                           packages, .venv with the project editable and the dev extra
# System packages are installed when root or passwordless sudo allows; otherwise the
# `apt-get install` line to run is printed, and set-up stops.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE="${1:-test}"
case "$MODE" in
  run) kinds=(run) ;;
  test) kinds=(run test) ;;
  *) echo "usage: scripts/setup.sh run|test" >&2; exit 2 ;;
esac
PYTHON="${PYTHON:-python3}"
# The one list of system packages (also scripts/install.sh's and .ci/run's).
LIST=scripts/system-packages.txt
packages_of() {  # the packages needed by any of these kinds (run, test, python, install)
  awk -v kinds=" $* " '!/^#/ && NF {
    n = split($2, needs, ",")
    for (i = 1; i <= n; i++) if (index(kinds, " " needs[i] " ")) { print $1; break }
  }' "$LIST"
}
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
if [ "$MODE" = test ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet --editable '.[dev]'
  touch .venv/.installed
  echo "Setup done: .venv is ready for the tests."
  exit 0
fi

# `make run`: the project as a user installs it, its dependencies and nothing else; a .venv set
# up for the tests already holds it (editable) and is left as it is.
if [ ! -e .venv/.installed ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet .
fi
# The voice's graph analysis now, not at the agent's first start (~17 s on 2 cores; once).
.venv/bin/voice-agent prepare --config "${VOICE_AGENT_CONFIG:-config/agent.yaml}"
touch .venv/.installed-run
echo "Setup done: .venv is ready to run."
