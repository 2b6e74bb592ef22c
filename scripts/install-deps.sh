#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages that ftkit needs:
#
#   scripts/install-deps.sh [build]   the C toolchain and libraries the build links
#                                     (what `make`, and so `make train`, needs)
#   scripts/install-deps.sh test      the build set plus what the test tiers need
#                                     (python3 with venv; the Python packages, torch
#                                     included, come from PyPI: scripts/setup-python.sh)
#
# A no-op when they are all present; otherwise apt-get (as root, or through sudo). Where
# there is no dpkg (not Debian/Ubuntu), it checks the build's libraries with pkg-config
# and says what is missing instead of installing.
set -euo pipefail

SET=${1:-build}
# OpenBLAS: the OpenMP build (libopenblas-openmp-dev; it installs beside the pthreads one
# without replacing the system's default libblas), which mk/config.mk links by its path.
BUILD=(
  build-essential pkg-config
  libjansson-dev libyaml-dev libopenblas-openmp-dev libpcre2-dev libutf8proc-dev
  libopenmpi-dev openmpi-bin
)
# conformance suite: a virtualenv (scripts/setup-python.sh) whose packages come from PyPI
TEST=(python3 python3-venv)

case "$SET" in
  build) PACKAGES=("${BUILD[@]}") ;;
  test) PACKAGES=("${BUILD[@]}" "${TEST[@]}") ;;
  *) echo "usage: scripts/install-deps.sh [build|test]" >&2; exit 2 ;;
esac

if ! command -v dpkg-query > /dev/null 2>&1; then
  missing=()
  for m in jansson yaml-0.1 openblas libpcre2-8 libutf8proc; do
    pkg-config --exists "$m" 2>/dev/null || missing+=("$m")
  done
  command -v cc > /dev/null 2>&1 || missing+=("a C compiler")
  if [ ${#missing[@]} -ne 0 ]; then
    echo "install-deps: not a Debian/Ubuntu system; install these by hand (with their" \
         "development headers): ${missing[*]}" >&2
    exit 1
  fi
  [ "$SET" = build ] || echo "install-deps: not a Debian/Ubuntu system: the tests also need" \
                             "python3 with venv (scripts/setup-python.sh installs the rest from PyPI)" >&2
  exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo > /dev/null 2>&1 || {
    echo "install-deps: missing ${missing[*]}; run as root: apt-get install ${missing[*]}" >&2
    exit 1
  }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
