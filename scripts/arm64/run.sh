#!/usr/bin/env bash
# `make test-arm64`: prove that the agent installs and runs on aarch64 (Debian bookworm arm64, the
# base of Raspberry Pi OS 64-bit) in a debootstrap root run through qemu-user-static.
# This part readies the host (packages, binfmt_misc, the host venv); arm64_check.py does the rest
# in private mount and PID namespaces, so no mount or process of the root outlives the run, even
# when this script is killed (the check then gets SIGTERM and cleans up). See docs/arm64.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ARM64_T0="$(date +%s.%N)"
export ARM64_T0

if [ "$(id -u)" -ne 0 ]; then
  echo "test-arm64 needs root (debootstrap, chroot, mount): run it as root." >&2
  exit 1
fi

HOST_PACKAGES=(qemu-user-static binfmt-support debootstrap)
missing=()
for pkg in "${HOST_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "Installing host packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The kernel runs the root's aarch64 programs through qemu-aarch64-static once binfmt_misc knows it.
BINFMT=/proc/sys/fs/binfmt_misc
[ -e "$BINFMT/register" ] || mount -t binfmt_misc binfmt_misc "$BINFMT"
if ! grep -qx enabled "$BINFMT/qemu-aarch64" 2>/dev/null; then
  update-binfmts --enable qemu-aarch64
fi
if ! grep -qx enabled "$BINFMT/qemu-aarch64" 2>/dev/null; then
  echo "binfmt_misc has no enabled qemu-aarch64 entry: aarch64 programs cannot run here." >&2
  exit 1
fi

# The host venv: the x86_64 reference synthesis and the MQTT watcher (a no-op once set up).
make --no-print-directory setup

exec unshare --mount --propagation private --pid --fork --kill-child=SIGTERM \
  .venv/bin/python scripts/arm64/arm64_check.py "$@"
