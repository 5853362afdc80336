"""The launch-level metrics worth reading first from an ncu report's details page (duration,
DRAM throughput, occupancy and its limits, eligible / issued warps, waves), one line per
(launch, metric): `ncu --import R.ncu-rep --page details --csv > details.csv`, then

  ncu_details.py details.csv
"""
import csv
import sys

WANT = ("Duration", "DRAM Throughput", "Memory Throughput", "Achieved Occupancy",
        "Theoretical Occupancy", "Eligible Warps Per Scheduler", "Issued Warp Per Scheduler",
        "No Eligible", "Registers Per Thread", "Block Limit Shared Mem", "Block Limit Registers",
        "Dynamic Shared Memory Per Block", "Waves Per SM", "Grid Size",
        "Active Warps Per Scheduler", "Warp Cycles Per Issued Instruction", "L2 Hit Rate")


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    # ncu may print its own lines (==PROF==, warnings) before the CSV header.
    start = next((i for i, r in enumerate(rows) if "Metric Name" in r), None)
    if start is None:
        sys.exit(f"{sys.argv[1]}: no CSV header with 'Metric Name'")
    rows = rows[start:]
    hdr = rows[0]
    ki, ii, mi, vi, ui = (hdr.index(h) for h in ("Kernel Name", "ID", "Metric Name",
                                                  "Metric Value", "Metric Unit"))
    for r in rows[1:]:
        # Metric rows may stop before the header's trailing rule columns.
        if len(r) > max(ki, ii, mi, vi, ui) and r[mi] in WANT:
            print(r[ii], r[ki][:30], r[mi], r[vi], r[ui])


if __name__ == "__main__":
    main()
