#!/usr/bin/env bash
# Summarizes an ncu report for the device scripts: the details page as OUT/details.csv with its
# first-read metrics printed (ncu_details.py), the N SASS lines with the most stall samples as
# OUT/top_sass.txt, its head printed (ncu_top_sass.py), and the samples summed by region between
# barriers, waits, fences and exits as OUT/regions.txt, printed (ncu_regions.py). Run from the
# repository root.
#   scripts/gpu/ncu_summary.sh REPORT.ncu-rep OUT [N]
rep="${1:?usage: ncu_summary.sh REPORT OUT [N]}"
out="${2:?usage: ncu_summary.sh REPORT OUT [N]}"
ncu --import "$rep" --page details --csv >"$out/details.csv" 2>/dev/null
python3 scripts/gpu/ncu_details.py "$out/details.csv"
ncu --import "$rep" --page source --csv --print-source sass >"$out/source.csv" 2>/dev/null
python3 scripts/gpu/ncu_top_sass.py "${3:-20}" <"$out/source.csv" >"$out/top_sass.txt"
head -70 "$out/top_sass.txt"
python3 scripts/gpu/ncu_regions.py <"$out/source.csv" | tee "$out/regions.txt"
