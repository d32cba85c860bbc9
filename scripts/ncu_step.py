"""Where one decode step's time goes, kernel by kernel, from an Nsight Compute raw CSV of a whole
un-captured `bench` run (`ncu --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum`,
as scripts/h200_call.sh's `ncustep:` step writes it).

The run ends in decode steps that launch the same kernels in the same order, so the last step is
the shortest tail that repeats just before itself. Per kernel name: launches, total microseconds,
megabytes read and the read rate; then the step's kernel-time sum (kernels serialised, as Nsight
Compute runs them) to set against the graph-replayed step time `bench` reports.

    python3 scripts/ncu_step.py ncustep-qwen3.6-35b-a3b.csv [--min-period 20]
"""

import argparse
from collections import defaultdict

from ncu_summary import launch_rows, number


def launches(path):
    rows = launch_rows(path)
    if rows is None:
        raise SystemExit(f"{path}: no ncu CSV (see the .err file next to it)")
    return [
        (
            r["Kernel Name"],
            number(r.get("gpu__time_duration.sum")) / 1e3,
            number(r.get("dram__bytes_read.sum")) / 1e6,
        )
        for r in rows
    ]


def last_step(names, min_period):
    """The length of the shortest tail (>= min_period launches) equal to the launches before it."""
    for p in range(min_period, len(names) // 2 + 1):
        if names[-p:] == names[-2 * p : -p]:
            return p
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--min-period", type=int, default=20)
    args = ap.parse_args()
    runs = launches(args.csv)
    period = last_step([name for name, _, _ in runs], args.min_period)
    if period is None:
        raise SystemExit(f"{args.csv}: no repeating decode step among {len(runs)} launches")
    step = runs[-period:]
    by_name = defaultdict(lambda: [0, 0.0, 0.0])
    for name, us, mb in step:
        entry = by_name[name]
        entry[0] += 1
        entry[1] += us
        entry[2] += mb
    total_us = sum(us for _, us, _ in step)
    total_mb = sum(mb for _, _, mb in step)
    print(f"{args.csv}: one decode step = {period} launches, {total_us:.1f} us of kernels, {total_mb:.1f} MB read")
    for name, (count, us, mb) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        rate = mb / us if us else 0.0  # MB/us = TB/s
        print(
            f"  {name[:44]:44s} x{count:4d} {us:9.1f} us ({100 * us / total_us:5.1f} %)"
            f" {us / count:7.2f} us each {mb:9.1f} MB {rate:5.2f} TB/s"
        )


if __name__ == "__main__":
    main()
