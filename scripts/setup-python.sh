#!/usr/bin/env bash
# Makes the virtualenv the conformance suite runs in: Debian's python3 with its CPU
# torch (system site packages), plus transformers and peft pinned to versions that work
# with that torch. Re-run is a no-op once the stamp matches the pins.
set -euo pipefail

VENV=${1:-.venv}
PY=/usr/bin/python3
PINS=(transformers==4.46.3 peft==0.13.2 safetensors pytest)
STAMP="$VENV/.ftkit-pins"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${PINS[*]}" ]; then
  exit 0
fi
rm -rf "$VENV"
"$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}"
echo "${PINS[*]}" > "$STAMP"
