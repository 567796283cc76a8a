#!/usr/bin/env bash
# `make chaos`: every chaos scenario in turn (or those named: SCENARIOS="faults kill9"), each printing its figures
# and PASS/FAIL per claim. Exits non-zero when any claim of any scenario does not hold. See README "Chaos".
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
failed=()
for s in ${SCENARIOS:-kill9 pg-restart sigterm faults}; do
  echo
  echo "######## chaos/$s"
  bash "$dir/$s.sh" || failed+=("$s")
done
echo
if [ "${#failed[@]}" -gt 0 ]; then
  echo "chaos: FAILED: ${failed[*]}"
  exit 1
fi
echo "chaos: every scenario's claims hold"
