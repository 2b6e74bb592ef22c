#!/usr/bin/env bash
# Makes the virtualenv the conformance suite runs in: the system's python3 (no
# --system-site-packages: a Debian python3-torch must not be seen), with the current
# Hugging Face stack from PyPI, every package pinned by scripts/python-requirements.txt.
#
#   scripts/setup-python.sh [VENV]          make or update VENV (default .venv) from the lock
#   scripts/setup-python.sh --lock [VENV]   resolve scripts/python-requirements.in again,
#                                           install it into VENV and write the lock from it
#
# The wheels are kept in a cache, $VENV/wheels (FT_WHEEL_CACHE=DIR puts it elsewhere, e.g.
# one cache for several checkouts): the PyPI torch brings ~3 GB of CUDA libraries, fetched
# once. A wheel already in the cache is never fetched again; installing reads only the
# cache (pip --no-index). When the lock changes, site-packages is rebuilt and the cache
# kept. A stamp ($VENV/.ftkit-lock) makes a re-run with an unchanged lock a no-op.
set -euo pipefail

LOCK_MODE=0
if [ "${1:-}" = --lock ]; then
  LOCK_MODE=1
  shift
fi
VENV=${1:-.venv}
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
IN="$HERE/python-requirements.in"
LOCK="$HERE/python-requirements.txt"
CACHE=${FT_WHEEL_CACHE:-$VENV/wheels}
STAMP="$VENV/.ftkit-lock"

say() { echo "setup-python: $*" >&2; }
die() { say "$*"; exit 1; }

[ -x "$PY" ] || die "$PY not found (scripts/install-deps.sh test installs python3 and python3-venv)"
[ -f "$LOCK" ] || [ "$LOCK_MODE" = 1 ] || die "$LOCK missing (scripts/setup-python.sh --lock makes it)"

# What the venv was made from: the lock's contents and the interpreter's version.
want() { { "$PY" --version; cat "$LOCK"; } | sha256sum | cut -d' ' -f1; }

if [ "$LOCK_MODE" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(want)" ]; then
  exit 0
fi

# A link to a venv made elsewhere (shared by several checkouts) is used when it holds
# exactly the lock's packages, and never rebuilt through the link.
if [ -L "$VENV" ]; then
  if [ "$LOCK_MODE" = 0 ] && [ -x "$VENV/bin/python" ] &&
     [ "$("$VENV/bin/python" -m pip freeze --all --exclude pip 2>/dev/null | sort)" = \
       "$(grep -v '^#' "$LOCK" | sort)" ]; then
    exit 0
  fi
  die "$VENV is a link to $(readlink -f "$VENV"), which does not hold exactly the packages" \
      "of $LOCK; not rebuilding a venv through a link (remove the link to make one here)"
fi

# A fresh site-packages: everything in VENV goes but the wheel cache.
mkdir -p "$VENV" "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
VENV_ABS=$(cd "$VENV" && pwd)
for f in "$VENV_ABS"/* "$VENV_ABS"/.[!.]*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  [ "$f" = "$CACHE" ] && continue
  rm -rf "$f"
done
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# fetch REQS...: download into the cache the wheels it does not hold yet (pip skips a
# file already there, but asks the index to resolve: it is called only when the cache
# does not hold them all).
fetch() {
  say "downloading wheels into $CACHE"
  "${PIP[@]}" download -q --no-cache-dir -d "$CACHE" "$@"
  # A package PyPI has only as source (rouge_score) is built into a wheel once, in the
  # cache, so that installing needs neither the index nor its build tools again.
  # --use-pep517 builds it in an isolated environment with build tools from the index:
  # without it pip 23.0 (Debian 12's venv) runs the legacy `setup.py bdist_wheel` with the
  # venv's setuptools 66, which has no bdist_wheel without the wheel package.
  local s
  for s in "$CACHE"/*.tar.gz; do
    [ -e "$s" ] || continue
    compgen -G "${s%.tar.gz}-*.whl" > /dev/null && continue
    "${PIP[@]}" wheel -q --use-pep517 --no-cache-dir --no-deps -w "$CACHE" "$s"
  done
}

if [ "$LOCK_MODE" = 1 ]; then
  fetch -r "$IN"
  "${PIP[@]}" install -q --no-index --find-links "$CACHE" -r "$IN"
  {
    echo "# Made by scripts/setup-python.sh --lock from python-requirements.in ($("$PY" --version),"
    echo "# $(uname -s) $(uname -m)); every package the venv holds, pinned. Do not edit by hand."
    "${PIP[@]}" freeze --all --exclude pip
  } > "$LOCK"
  say "wrote $LOCK"
else
  # Offline from the cache first; only when a wheel is missing, fetch (exact versions,
  # no resolution: the lock is complete) and install again.
  if ! "${PIP[@]}" install -q --no-index --find-links "$CACHE" --no-deps -r "$LOCK" 2> "$VENV/.pip-offline.log"; then
    fetch --no-deps -r "$LOCK"
    "${PIP[@]}" install -q --no-index --find-links "$CACHE" --no-deps -r "$LOCK"
  fi
  rm -f "$VENV/.pip-offline.log"
  # --no-deps trusts the lock to be complete: pip check says if it is not.
  "${PIP[@]}" check > /dev/null || { "${PIP[@]}" check >&2 || true
    die "$LOCK is incomplete (scripts/setup-python.sh --lock makes it again)"; }
fi

# The torch in use must be the venv's own PyPI torch 2.x, not a system one.
"$VENV/bin/python" - "$VENV_ABS" <<'PYEOF'
import os, sys
venv = sys.argv[1]
try:
    import torch
except Exception as e:
    sys.exit(f"setup-python: torch does not import in {venv}: {e}")
where = os.path.realpath(torch.__file__)
if not where.startswith(os.path.realpath(venv) + os.sep):
    sys.exit(f"setup-python: torch comes from {where}, not from the venv {venv}")
if not torch.__version__.startswith("2."):
    sys.exit(f"setup-python: torch {torch.__version__} in {venv}; the suite needs PyPI's torch 2.x")
PYEOF
want > "$STAMP"
