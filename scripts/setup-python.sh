#!/usr/bin/env bash
# Makes the virtualenv the conformance suite runs in: Debian's python3 with its CPU
# torch 1.13 (python3-torch, seen through --system-site-packages), plus transformers and
# peft pinned to versions that work with it. Debian's torch calls itself 1.13.0a0, which
# does not satisfy peft's "torch>=1.13.0", so peft goes in with --no-deps and its other
# requirements are listed here: pip must never pull a torch wheel from PyPI (gigabytes of
# CUDA libraries). Re-running is a no-op once the stamp matches the pins.
set -euo pipefail

VENV=${1:-.venv}
PY=/usr/bin/python3
PINS=(transformers==4.46.3 accelerate==0.34.2 safetensors pytest psutil pyyaml tqdm packaging jinja2 tensorboard~=2.17.0 rouge_score==0.1.2)
NODEPS=(peft==0.13.2)
# bitsandbytes is not installed (it needs torch >= 2.4): its wheel is downloaded into
# $VENV/wheels, and tests/conformance/test_bnb_reference.py runs its reference code
# from there.
WHEELS=(bitsandbytes==0.50.2)
STAMP="$VENV/.ftkit-pins"
WANT="${PINS[*]} ${NODEPS[*]} wheels: ${WHEELS[*]}"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi
rm -rf "$VENV"
"$PY" -m venv --system-site-packages "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
"${PIP[@]}" "${PINS[@]}"
"${PIP[@]}" --no-deps "${NODEPS[@]}"
"$VENV/bin/pip" download -q --disable-pip-version-check --no-deps -d "$VENV/wheels" "${WHEELS[@]}"
# The torch in use must be Debian's, not one pip brought in.
"$VENV/bin/python" - <<'PYEOF'
import sys, torch
if not torch.__file__.startswith("/usr/lib/python3/"):
    sys.exit(f"setup-python: torch comes from {torch.__file__}, not Debian's python3-torch")
PYEOF
echo "$WANT" > "$STAMP"
