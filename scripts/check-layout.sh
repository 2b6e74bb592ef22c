#!/usr/bin/env bash
# The shape of lib/, checked (part of make test-unit):
#   - lib/ holds subsystem folders only, no files at its top;
#   - each folder has one main header whose top comment says " * May call: a, b, c." (the
#     folders it may include; "kernels" is kernels/ops.h and kernels/cuda/), and its files
#     include nothing else of lib/ and kernels/;
#   - those "may call" lists have no circle (calls go one way), and kernels/ calls core
#     only;
#   - run-config keys are read by name only inside lib/config/;
#   - the Layout table of docs/layout.md lists the same "may call" folders, and has a row
#     for every folder (and no row for a folder that is gone).
# Prints one line per check and "layout: N passed, N failed"; exits non-zero on a failure.
set -u
cd "$(dirname "$0")/.."
passed=0; failed=0
ok() { passed=$((passed + 1)); }
fail() { echo "layout: FAIL: $*"; failed=$((failed + 1)); }

top=$(find lib -maxdepth 1 -type f | sort)
if [ -z "$top" ]; then ok; else fail "files at the top of lib/: $top"; fi

folders=$(find lib -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort)
LAYOUT=docs/layout.md
# the folders the Layout table has rows for: | `core/` | ... | may call |
rows=$(grep -oE '^\| `[a-z_]+/` \|' "$LAYOUT" 2>/dev/null | sed -E 's/^\| `([a-z_]+)\/` \|/\1/' | sort)
if [ "$rows" = "$folders" ]; then ok
else fail "$LAYOUT's Layout table has rows for '$(echo $rows)', lib/ has '$(echo $folders)'"; fi
edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
for d in $folders; do
  mains=$(grep -l '^ \* May call:' lib/"$d"/*.h 2>/dev/null)
  if [ "$(printf '%s\n' "$mains" | grep -c .)" -ne 1 ]; then
    fail "lib/$d: want one main header with a ' * May call:' line, found: ${mains:-none}"
    continue
  fi
  ok
  # " * May call: core/ (errors), config/." -> "core config"
  allowed=$(grep -h '^ \* May call:' "$mains" | sed -E 's/^ \* May call://; s/\([^)]*\)//g' \
            | tr ',.' '  ' | tr ' ' '\n' | sed -E 's#/$##' | grep -E '^[a-z_]+$' \
            | grep -vx 'nothing' | sort -u)
  # the Layout table of docs/layout.md says the same
  row=$(grep -E "^\| \`$d/\` \|" "$LAYOUT" | awk -F'|' '{print $4}' | tr ',' '\n' \
        | tr -d ' ' | grep -vx 'nothing' | grep . | sort -u)
  if [ "$row" = "$allowed" ]; then ok
  else fail "$LAYOUT's Layout row of $d/ says '$(echo $row)', $mains '$(echo $allowed)'"; fi
  for a in $allowed; do
    if [ "$a" = kernels ] || [ -d "lib/$a" ]; then echo "$d $a" >> "$edges"
    else fail "$mains: May call names '$a', which is no folder of lib/"; fi
  done
  bad=""
  for f in lib/"$d"/*.[ch]; do
    for inc in $(grep -hoE '^#include "[^"]+"' "$f" | sed -E 's/#include "(.*)"/\1/'); do
      case $inc in
        ops.h|cuda/*) to=kernels ;;
        */*) to=${inc%%/*}; [ -d "lib/$to" ] || continue ;;
        *) continue ;;
      esac
      [ "$to" = "$d" ] && continue
      printf '%s\n' "$allowed" | grep -qx "$to" || bad="$bad $f->$inc"
    done
  done
  if [ -z "$bad" ]; then ok; else fail "lib/$d includes what its May call line leaves out:$bad"; fi
done

# calls go one way: tsort finds a loop in the "may call" graph
loops=$(tsort "$edges" 2>&1 >/dev/null | grep -v 'input contains a loop' | sed 's/^tsort: //' \
        | head -n 16 | tr '\n' ' ')
if [ -z "$loops" ]; then ok; else fail "the folders' May call lines make a circle through: $loops"; fi

kbad=$(grep -rhoE '^#include "[a-z_]+/[^"]+"' kernels | sed -E 's/#include "([a-z_]+)\/.*/\1/' \
       | sort -u | while read -r to; do [ -d "lib/$to" ] && [ "$to" != core ] && echo "$to"; done)
if [ -z "$kbad" ]; then ok; else fail "kernels/ includes lib/ folders other than core: $kbad"; fi

named=$(grep -rnE 'ft_config_(str|int|float|bool|has)\(' lib tools | grep -v '^lib/config/')
if [ -z "$named" ]; then ok; else fail "config keys read by name outside lib/config/: $named"; fi

echo "layout: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
