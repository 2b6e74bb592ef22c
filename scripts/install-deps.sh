#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages that the build and the test tiers need.
# A no-op when they are all present; otherwise apt-get (as root, or through sudo).
set -euo pipefail

PACKAGES=(
  build-essential pkg-config
  libjansson-dev libyaml-dev libopenblas-dev libpcre2-dev libutf8proc-dev
  # conformance suite: Debian's CPU torch, used from a virtualenv (scripts/setup-python.sh)
  python3 python3-venv python3-pip python3-torch python3-numpy
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
