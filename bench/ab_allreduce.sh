#!/usr/bin/env bash
# ab_allreduce.sh -- two builds of khor side by side on the allreduce benchmark: 8 B and
# 64 MiB, over tcp and shm, at 2 and 4 ranks, the two builds' runs alternating in rounds so
# that both see the same machine. Prints the median time of each and new/old; a change that
# should not move speed (a refactor) is expected within the rounds' spread.
#
#   bench/ab_allreduce.sh OLD_BUILD NEW_BUILD [ROUNDS] [CSV]
#
# Each build directory needs khorrun and khor-bench. ROUNDS defaults to 5; CSV (default
# ab_allreduce.csv) gets every run's row. AB_OLD_ENV and AB_NEW_ENV (space-separated
# VAR=VALUE) go to the ranks of each side, so that one build can be set against itself:
#   AB_NEW_ENV=KHOR_CHECKSUM=1 bench/ab_allreduce.sh build build
# AB_NRANKS (default "2 4") and AB_TRANSPORTS (default "tcp shm") narrow the matrix.
set -euo pipefail
old=${1:?usage: ab_allreduce.sh OLD_BUILD NEW_BUILD [ROUNDS] [CSV]}
new=${2:?usage: ab_allreduce.sh OLD_BUILD NEW_BUILD [ROUNDS] [CSV]}
rounds=${3:-5}
csv=${4:-ab_allreduce.csv}
for b in "$old" "$new"; do
  [ -x "$b/khorrun" ] && [ -x "$b/khor-bench" ] || { echo "no khorrun/khor-bench in $b" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "build,round,transport,nranks,size,time_us" > "$csv"
# 8 B: many calls, latency; 64 MiB: a few, bandwidth.
read -r -a old_env <<< "${AB_OLD_ENV:-}"
read -r -a new_env <<< "${AB_NEW_ENV:-}"
run() { # build label transport n size iters
  local xs=() e
  if [ "$2" = old ]; then
    for e in ${old_env[@]+"${old_env[@]}"}; do xs+=(-x "$e"); done
  else
    for e in ${new_env[@]+"${new_env[@]}"}; do xs+=(-x "$e"); done
  fi
  "$1/khorrun" -np "$4" ${xs[@]+"${xs[@]}"} "$1/khor-bench" allreduce -b "$5" -e "$5" -n "$6" -w 10 -c 1 -q --progress 0 \
    --transport "$3" --csv "$tmp/one.csv" > /dev/null
  t=$(tail -1 "$tmp/one.csv" | cut -d, -f10)
  echo "$2,$r,$3,$4,$5,$t" >> "$csv"
}
for r in $(seq 1 "$rounds"); do
  echo "round $r of $rounds" >&2
  for tp in ${AB_TRANSPORTS:-tcp shm}; do
    for n in ${AB_NRANKS:-2 4}; do
      for sz in 8:2000 64M:10; do
        size=${sz%%:*} iters=${sz#*:}
        # Alternate which build goes first, so neither always runs on a warmer machine.
        if [ $((r % 2)) -eq 1 ]; then
          run "$old" old "$tp" "$n" "$size" "$iters"; run "$new" new "$tp" "$n" "$size" "$iters"
        else
          run "$new" new "$tp" "$n" "$size" "$iters"; run "$old" old "$tp" "$n" "$size" "$iters"
        fi
      done
    done
  done
done
python3 - "$csv" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
keys = sorted({(r['transport'], int(r['nranks']), r['size']) for r in rows},
              key=lambda k: (k[0], k[1], len(k[2]), k[2]))
print('%-9s %3s %6s %12s %12s %8s %s' % ('transport', 'n', 'size', 'old us', 'new us', 'new/old',
                                        'old min-max / new min-max'))
for k in keys:
    t = {b: [float(r['time_us']) for r in rows
             if (r['transport'], int(r['nranks']), r['size']) == k and r['build'] == b]
         for b in ('old', 'new')}
    mo, mn = statistics.median(t['old']), statistics.median(t['new'])
    print('%-9s %3d %6s %12.2f %12.2f %8.3f %.1f-%.1f / %.1f-%.1f' % (
        k[0], k[1], k[2], mo, mn, mn / mo, min(t['old']), max(t['old']), min(t['new']),
        max(t['new'])))
EOF
