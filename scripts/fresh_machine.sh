#!/usr/bin/env bash
# `make test` from a fresh clone on a new machine: a new Debian 12 minbase root (debootstrap),
# git, make and python3 added, the current commit cloned into it (under /tmp by default), then
# `make setup` and `make test` in it as root (scripts/fresh_machine.py; docs/development.md).
# This part readies the host (debootstrap, the host venv for its pip configuration); the rest
# runs in private mount and PID namespaces, so no mount or process of the root outlives it.
#   scripts/fresh_machine.sh [--clone-dir /tmp/voice-agent] [--keep] [--cache DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "fresh_machine.sh needs root (debootstrap, chroot, mount): run it as root." >&2
  exit 1
fi
if ! dpkg-query -W -f='${Status}' debootstrap 2>/dev/null | grep -q "ok installed"; then
  echo "Installing host package: debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
fi
# The host venv: its pip reads the host's pip configuration (a no-op once set up).
make --no-print-directory setup

exec unshare --mount --propagation private --pid --fork --kill-child=SIGTERM \
  .venv/bin/python scripts/fresh_machine.py "$@"
