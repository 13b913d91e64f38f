#!/usr/bin/env bash
# A/B of khor-bench step at n = 2, interleaved: BASE=<build dir of the old code> ab.sh ROUNDS
# [TRANSPORTS]; the JSON of every run lands here as <transport>-<build>-<round>.json
# (build: base or new, new = ./build of this checkout). med.py reads them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
rounds=${1:-5}
transports=${2:-shm tcp}
for r in $(seq 1 "$rounds"); do
  for t in $transports; do
    for b in base new; do
      dir=$([ "$b" = base ] && echo "$BASE" || echo "$root/build")
      timeout 300 "$dir/khorrun" -np 2 "$dir/khor-bench" step --set small --steps 5 \
        --transport "$t" --lat-reps 2000 --json "$here/$t-$b-$r.json" -q
    done
  done
done
