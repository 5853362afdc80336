#!/usr/bin/env bash
# Session 26: where the MoE forward's time goes at decode sizes. ncu (clocks untouched) of the MoE
# kernels of bench_moe's default forward at each T in NCU_TS (the first NCU_COUNT launches of the
# MoE kernels: the routing pass bench_moe makes first, then eager forwards), one CSV row per
# kernel: duration, DRAM bytes and throughput, SM throughput. Binaries carried (BINS).
#   scripts/gpu/h_moe26/ncu_decode.sh [OUT_DIR]     env: BINS, NCU_TS ("1 4 16"), NCU_COUNT (26)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_moe26_ncu}}"
mkdir -p "$out"
c=/tmp/c26n
rm -rf "$c" && mkdir -p "$c" && xz -dc "${BINS:?packed binaries}" | tar -C "$c" -xf - bench_moe
for T in ${NCU_TS:-1 4 16}; do
  DS_MOE_CASES="mxfp4:$T:0:0" timeout 150 ncu --clock-control none \
    --kernel-name regex:'router|route|plan|quant|expert|combine' --launch-count "${NCU_COUNT:-26}" \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size \
    --csv "$c/bench_moe" "/tmp/ncu_$T.json" >"$out/ncu_decode_T$T.csv" 2>"/tmp/ncu_$T.err"
  echo "T=$T rc=$? $(wc -l <"$out/ncu_decode_T$T.csv") lines"
  python3 - "$out/ncu_decode_T$T.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki, mi, vi = hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value")
ui, ii = hdr.index("Metric Unit"), hdr.index("ID")
per = collections.OrderedDict()
for r in rows:
    per.setdefault((r[ii], r[ki][:40]), {})[r[mi]] = r[vi] + " " + r[ui]
short = {"gpu__time_duration.sum": "time", "dram__bytes_read.sum": "dram",
         "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
         "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm%", "launch__grid_size": "grid"}
for (i, k), m in list(per.items())[-14:]:
    print("%4s %-40s %s" % (i, k, "  ".join("%s %s" % (short.get(n, n), v) for n, v in m.items())))
PY
done
