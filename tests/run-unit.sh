#!/usr/bin/env bash
# Runs each unit-test binary given, adds up their "N passed, N failed" lines and
# prints the total. Exits non-zero if any test failed or a binary crashed.
set -u
passed=0; failed=0; status=0
for bin in "$@"; do
  out=$("$bin" 2>&1); rc=$?
  printf '%s\n' "$out"
  line=$(printf '%s\n' "$out" | grep -E '^[a-z_-]*:? ?[0-9]+ passed, [0-9]+ failed' | tail -n 1)
  if [ $rc -ne 0 ] && [ -z "$line" ]; then
    echo "$bin: crashed (exit $rc)"; failed=$((failed + 1)); status=1; continue
  fi
  p=$(printf "%s" "$line" | sed -E "s/(^|.*[^0-9])([0-9]+) passed.*/\\2/")
  f=$(printf '%s' "$line" | sed -E 's/.*passed, ([0-9]+) failed.*/\1/')
  passed=$((passed + p)); failed=$((failed + f))
  [ $rc -eq 0 ] || status=1
done
echo "unit: $passed passed, $failed failed"
[ $failed -eq 0 ] || status=1
exit $status
