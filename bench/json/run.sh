#!/usr/bin/env bash
# json: JSONValue's parse and write on the documents a push is made of (`marquee-bench json`), nanoseconds a
# document. With BASE=<git revision>, the same driver is also built against that revision's MarqueeCore (in a
# worktree under bench/out) and the two are run alternately, ROUNDS times each, side by side.
#   N (200000), BASE (none), ROUNDS (3)
source "$(dirname "$0")/../lib.sh"
n=${N:-200000}
rounds=${ROUNDS:-3}
bench_build
machine
current="$bin/marquee-bench"
if [ -z "${BASE:-}" ]; then
  "$current" json --n "$n"
  exit 0
fi
base="$out/json-base"
rm -rf "$base"
git -C "$root" worktree prune
git -C "$root" worktree add --detach "$base" "$BASE" >/dev/null 2>&1
trap 'git -C "$root" worktree remove --force "$base"' EXIT
# The driver as it is now, over the base's library.
cp "$root/bench/Sources/marquee-bench/"*.swift "$base/bench/Sources/marquee-bench/"
(cd "$base" && swift build -c release --product marquee-bench >&2)
before="$(cd "$base" && swift build -c release --show-bin-path)/marquee-bench"
for i in $(seq 1 "$rounds"); do
  echo "base $BASE: $("$before" json --n "$n")"
  echo "this tree: $("$current" json --n "$n")"
done
