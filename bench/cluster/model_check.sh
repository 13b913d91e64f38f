#!/usr/bin/env bash
# model_check.sh -- does khor's cost model predict what the simulated cluster measures?
#
# The model (collectives/select.c, run through khor-model) is what picks an algorithm per
# call; if its times are off by more than the gaps between schedules, it picks wrong. This
# runs the netns cluster (netns_cluster.sh) at k = 2, 4, 8 hosts, one rank each, with ring
# and tree at sizes where the 200 Mbit/s link, not this 2-core CPU, is the bottleneck, feeds
# khor-model the link's own parameters and reports measured / predicted for each point:
#
#   alpha  measured: the median time of an 8-byte ring allreduce on 2 hosts, / 2 (the ring
#          takes 2(n-1) = 2 message steps there, and 8 bytes cost no bandwidth)
#   beta   from the tbf rate: 8 / (rate x (MTU-52)/(MTU+14)), the TCP payload rate of a link
#          whose frames tbf counts with their Ethernet header
#   gamma  what khor itself measured at init (KHOR_LOG=info prints it); at 25 MB/s links it
#          changes predictions by well under 1%
#   slice  128K: the slice dbtree.c really pipelines with, min(KHOR_SLICE_BYTES,
#          scratch / (4 x KHOR_PIPELINE_DEPTH)) = min(512K, 2M / 16). The ring's
#          formula has no slice term. (allreduce_pick passes KHOR_SLICE_BYTES, 512K, which
#          makes the tree's pipeline-fill term 4x too large; see --slice-512k.)
#
# Then it plots predicted against measured (model_vs_measured.png) and the model's time per
# algorithm against n at a few sizes for a 100 Gbit/s, 8-ranks-per-host cluster
# (scale_model.png), both into bench/cluster/ unless --plots DIR says otherwise.
#
#   model_check.sh [--bench PATH] [--model PATH] [--ks "2 4 8"] [--out DIR] [--plots DIR]
set -u -o pipefail

PROG=model_check
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BENCH=${KHOR_BENCH:-$REPO/build/khor-bench}
MODEL=${KHOR_MODEL:-$REPO/build/khor-model}
KS="2 4 8"
RATE=200mbit
MTU=1500
OUT=${TMPDIR:-/tmp}/khor-model-check
PLOTS=$HERE
TOL=25
SLICE=128K

while [ $# -gt 0 ]; do
	case "$1" in
	--bench) BENCH=${2:?}; shift 2 ;;
	--model) MODEL=${2:?}; shift 2 ;;
	--ks) KS=${2:?}; shift 2 ;;
	--out) OUT=${2:?}; shift 2 ;;
	--plots) PLOTS=${2:?}; shift 2 ;;
	--slice-512k) SLICE=512K; shift ;;
	-h|--help) sed -n '2,28p' "$0"; exit 0 ;;
	*) echo "$PROG: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
done
say() { printf '[%s %s] %s\n' "$PROG" "$(date +%H:%M:%S)" "$*"; }
[ -x "$MODEL" ] || { echo "$PROG: khor-model not found at $MODEL; build it or pass --model" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "$PROG: gnuplot not found; apt-get install -y gnuplot-nox" >&2; exit 2; }
mkdir -p "$OUT" "$PLOTS" || exit 2

# ---- measure ----------------------------------------------------------------------------------
for k in $KS; do
	say "cluster k=$k: ring to 64M, tree to 16M, 8-byte latency (3 runs)"
	"$HERE/netns_cluster.sh" -k "$k" --rate "$RATE" --mtu "$MTU" --bench "$BENCH" \
		--algos ring,tree --lat-args "-b 8 -e 8 -n 300 -w 30" --lat-repeat 3 \
		--bw-args "-b 1M -f 4 -n 3 -w 1" --max ring=64M,tree=16M -c 1 --no-checks \
		--env KHOR_LOG=info --timeout 600 --out "$OUT/k$k" >"$OUT/k$k.log" 2>&1 ||
		{ echo "$PROG: the k=$k cluster run failed; see $OUT/k$k.log" >&2; tail -n 20 "$OUT/k$k.log" >&2; exit 1; }
done

# ---- model parameters ---------------------------------------------------------------------------
k0=$(echo "$KS" | awk '{ print $1 }')
t8=$(awk -F, '$5 == "ring" && $6 == 8 { print $7 }' "$OUT/k$k0/results.csv")
[ -n "$t8" ] || { echo "$PROG: no 8-byte ring time at k=$k0" >&2; exit 1; }
ALPHA=$(awk -v t="$t8" -v k="$k0" 'BEGIN { printf "%.1f", t / (2 * (k - 1)) }')
RATE_BPS=$(awk -v r="$RATE" 'BEGIN { r = tolower(r); n = r + 0
	m = r ~ /gbit/ ? 1e9 : r ~ /mbit/ ? 1e6 : r ~ /kbit/ ? 1e3 : 1; printf "%.0f", n * m }')
BW_MBS=$(awk -v r="$RATE_BPS" -v m="$MTU" 'BEGIN { printf "%.4f", r / 8 / 1e6 * (m - 52) / (m + 14) }')
GAMMA=$(grep -ho 'reduce [0-9.]* GB/s' "$OUT/k$k0"/logs/*rank0.log 2>/dev/null | head -n 1 | awk '{ print $2 }')
GAMMA=${GAMMA:-5}
say "model: alpha $ALPHA us (8 B ring on $k0 hosts: $t8 us), link $BW_MBS MB/s, reduce $GAMMA GB/s"

# What khor measured at init, for the record (rank 0's log line, first run of each k).
for k in $KS; do
	line=$(grep -h 'cost model' "$OUT/k$k"/logs/ring-bw-1.rank0.log 2>/dev/null | head -n 1 | sed 's/.*cost model/cost model/')
	echo "k=$k khor init: ${line:-no cost model line (KHOR_LOG=info)}"
done >"$OUT/init_models.txt"

# ---- predicted vs measured ---------------------------------------------------------------------
CMP=$OUT/model_vs_measured.csv
echo "hosts,algo,size,measured_us,predicted_us,ratio,within_tol" >"$CMP"
for k in $KS; do
	sizes=$(awk -F, 'NR > 1 && $6 >= 1048576 { print $6 }' "$OUT/k$k/results.csv" | sort -un | paste -sd, -)
	[ -n "$sizes" ] || continue
	"$MODEL" -n "$k" --sizes "$sizes" --algos ring,tree --ppn 1 --alpha "$ALPHA" --slice "$SLICE" \
		--bw "${BW_MBS}MB/s" --gamma "${GAMMA}GB/s" --csv - >"$OUT/pred-k$k.csv" ||
		{ echo "$PROG: khor-model failed" >&2; exit 1; }
	awk -F, -v k="$k" -v tol="$TOL" '
		FNR == NR { if (FNR > 1) pred[$4, $3] = $5; next }
		FNR > 1 && $6 >= 1048576 && (($5, $6) in pred) {
			p = pred[$5, $6]; r = $7 / p
			printf "%d,%s,%d,%.0f,%.0f,%.3f,%s\n", k, $5, $6, $7, p, r,
			       (r >= 1 - tol / 100 && r <= 1 + tol / 100) ? "yes" : "no"
		}' "$OUT/pred-k$k.csv" "$OUT/k$k/results.csv" >>"$CMP"
done

TABLE=$OUT/model_vs_measured.md
{
	echo "### khor-model vs the netns cluster ($RATE links, 1 rank per host)"
	echo
	echo "Model: alpha $ALPHA us (8 B ring on $k0 hosts), link $BW_MBS MB/s (tbf rate x TCP payload share at MTU $MTU), reduce $GAMMA GB/s, tree slice $SLICE."
	echo
	echo "| hosts | algo | size | measured (ms) | predicted (ms) | measured/predicted | within ${TOL}% |"
	echo "|---:|---|---:|---:|---:|---:|---|"
	awk -F, 'NR > 1 { printf "| %d | %s | %dM | %.1f | %.1f | %.2f | %s |\n", $1, $2, $3 / 1048576, $4 / 1000, $5 / 1000, $6, $7 }' "$CMP"
	echo
	echo "8-byte allreduce (median of 3 runs) and the alpha it implies:"
	echo
	echo "| hosts | ring 8 B (us) | alpha = t/(2(k-1)) (us) | tree 8 B (us) | model tree 8 B (us) |"
	echo "|---:|---:|---:|---:|---:|"
	for k in $KS; do
		r8=$(awk -F, '$5 == "ring" && $6 == 8 { print $7 }' "$OUT/k$k/results.csv")
		t8k=$(awk -F, '$5 == "tree" && $6 == 8 { print $7 }' "$OUT/k$k/results.csv")
		pt=$("$MODEL" -n "$k" --sizes 8 --algos tree --ppn 1 --alpha "$ALPHA" --bw "${BW_MBS}MB/s" --csv - | awk -F, 'NR == 2 { print $5 }')
		awk -v k="$k" -v r="$r8" -v t="$t8k" -v p="$pt" 'BEGIN { printf "| %d | %.0f | %.1f | %.0f | %.0f |\n", k, r, r / (2 * (k - 1)), t, p }'
	done
	echo
	awk -F, 'NR > 1 { n++; if ($7 == "yes") y++ } END { printf "%d of %d points within %d%%.\n", y, n, '"$TOL"' }' "$CMP"
	echo
	echo '```'
	cat "$OUT/init_models.txt"
	echo '```'
} >"$TABLE"
cat "$TABLE"

# ---- plots --------------------------------------------------------------------------------------
say "plotting into $PLOTS"
for k in $KS; do
	for a in ring tree; do
		awk -F, -v k="$k" -v a="$a" 'NR > 1 && $1 == k && $2 == a { print $5 / 1000, $4 / 1000, $3 / 1048576 }' "$CMP" >"$OUT/pts-$a-k$k.dat"
	done
done
plot_cmds=""
pt=5
for a in ring tree; do
	for k in $KS; do
		pt=$((pt + 2))
		plot_cmds+="'$OUT/pts-$a-k$k.dat' using 1:2 with linespoints pt $pt ps 1.6 lw 1.5 title '$a, $k hosts', "
	done
done
plot_cmds=${plot_cmds%, }
gnuplot <<EOF || { echo "$PROG: gnuplot failed (model_vs_measured)" >&2; exit 1; }
set terminal pngcairo size 900,700 font ',11'
set output '$PLOTS/model_vs_measured.png'
set title "khor cost model vs netns cluster ($RATE tbf links, 1 rank/host)\nallreduce 1 MiB - 64 MiB; alpha $ALPHA us, link $BW_MBS MB/s, tree slice $SLICE"
set logscale xy
set xlabel 'predicted time (ms)'
set ylabel 'measured time (ms)'
set grid
set key top left
set xrange [20:8000]
set yrange [20:8000]
plot x with lines lc rgb 'black' dt 1 title 'measured = predicted', \
     1.25*x with lines lc rgb 'gray50' dt 2 title '+/- 25%', \
     0.75*x with lines lc rgb 'gray50' dt 2 notitle, \
     $plot_cmds
EOF

# The scale model: a 100 Gbit/s, alpha 10 us cluster with 8 ranks per host (hier over
# 20 GB/s, 1 us links inside a host), n = 2..4096 powers of two plus a few others.
NS="2,3,4,6,8,12,16,24,32,48,64,96,128,256,384,512,1024,2048,3072,4096"
"$MODEL" -n "$NS" --sizes 8,64K,16M,1G --alpha 10 --bw 100Gbit/s --gamma 10GB/s --ppn 8 \
	--intra-alpha 1 --intra-bw 20GB/s --csv - >"$OUT/scale.csv" || exit 1
"$MODEL" -n "$NS" --sizes 8,64K,16M,1G --alpha 10 --bw 100Gbit/s --gamma 10GB/s --ppn 8 \
	--intra-alpha 1 --intra-bw 20GB/s -q >"$OUT/scale.txt" || exit 1
for s in 8 65536 16777216 1073741824; do
	for a in ring tree rd hd hier; do
		awk -F, -v s="$s" -v a="$a" 'NR > 1 && $3 == s && $4 == a { print $1, $5 }' "$OUT/scale.csv" >"$OUT/scale-$a-$s.dat"
	done
done
panel() { # size label
	local s=$1 l=$2 cmds="" a
	for a in ring tree rd hd hier; do
		cmds+="'$OUT/scale-$a-$s.dat' using 1:2 with linespoints lw 2 title '$a', "
	done
	printf "set title '%s'\nplot %s\n" "$l" "${cmds%, }"
}
gnuplot <<EOF || { echo "$PROG: gnuplot failed (scale_model)" >&2; exit 1; }
set terminal pngcairo size 1200,900 font ',10'
set output '$PLOTS/scale_model.png'
set multiplot layout 2,2 title "khor cost model: predicted allreduce time vs ranks (alpha 10 us, 100 Gbit/s, 10 GB/s reduce; hier: 8 ranks/host, 1 us, 20 GB/s inside)"
set logscale xy
set xlabel 'ranks n'
set ylabel 'predicted time (us)'
set grid
set key top left
set xrange [2:4096]
$(panel 8 '8 B')
$(panel 65536 '64 KiB')
$(panel 16777216 '16 MiB')
$(panel 1073741824 '1 GiB')
unset multiplot
EOF
say "wrote $PLOTS/model_vs_measured.png, $PLOTS/scale_model.png, $TABLE, $CMP"
