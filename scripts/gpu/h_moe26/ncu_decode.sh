#!/usr/bin/env bash
# Session 26: where the MoE forward's time goes at decode sizes. ncu (clocks untouched) of the MoE
# kernels of bench_moe's default forward at each T in NCU_TS (the first NCU_COUNT launches of the
# MoE kernels: the routing pass bench_moe makes first, then eager forwards), one CSV row per
# kernel: duration, DRAM bytes and throughput, SM throughput. Binaries carried (BINS).
# NCU_PREFILL=1: also `--set full` of the first gate/up and down wgmma launches of the default
# prefill at T = 4096 (per-slot mbarriers since session 26): details and the top SASS stall lines.
#   scripts/gpu/h_moe26/ncu_decode.sh [OUT_DIR]     env: BINS, NCU_TS ("1 4 16"), NCU_COUNT (26),
#   NCU_PREFILL
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
if [ "${NCU_PREFILL:-0}" = 1 ]; then
  DS_MOE_CASES="mxfp4:4096:0:0" timeout 300 ncu --clock-control none \
    --kernel-name regex:expert_gemm_wg_kernel --launch-count 2 --set full --import-source yes -f \
    -o /tmp/ncu_pf "$c/bench_moe" /tmp/ncu_pf.json >/tmp/ncu_pf.log 2>&1
  echo "ncu prefill rc=$?"
  ncu -i /tmp/ncu_pf.ncu-rep --page details >"$out/ncu_prefill_4096.txt" 2>&1
  ncu -i /tmp/ncu_pf.ncu-rep --page source --csv --print-source=sass >/tmp/ncu_pf.csv 2>&1
  python3 scripts/gpu/h_mla16/sass_top.py /tmp/ncu_pf.csv 30 >"$out/ncu_prefill_4096_sass.txt" 2>&1
  grep -E "expert_gemm_wg|Duration|Issue Slots Busy|Eligible Warps|No Eligible|DRAM Throughput|L2 Hit|Compute \(SM\) Throughput|Executed Ipc Active" \
    "$out/ncu_prefill_4096.txt" | head -30
fi

