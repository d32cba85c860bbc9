"""One line per kernel launch from an Nsight Compute raw CSV (`ncu --csv --page raw --metrics ...`,
as scripts/h200_call.sh's `ncu:` step writes it): duration, DRAM throughput and bytes, warps per SM,
issue rate, long-scoreboard stall ratio and the fraction of elapsed cycles the SMs were active.

    python3 scripts/ncu_summary.py ncu-default.csv
"""

import csv
import sys


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return float("nan")


def launch_rows(path):
    """The CSV's rows, one per kernel launch (after ncu's log lines and the units row), or None when
    the file holds no ncu CSV."""
    lines = open(path).read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return None
    return list(csv.DictReader(lines[start:]))[1:]  # rows[0] holds the units (ns, byte, %)


def main(path):
    rows = launch_rows(path)
    if rows is None:
        print(f"{path}: no ncu CSV (see the .err file next to it)")
        return
    for r in rows:
        field = lambda name: r.get(name, "?")
        active = number(field("sm__cycles_active.avg")) / max(1.0, number(field("gpc__cycles_elapsed.max")))
        print(
            f"{field('Kernel Name')[:34]:34s} grid {field('launch__grid_size'):>6s}"
            f" regs {field('launch__registers_per_thread'):>4s}"
            f" us {number(field('gpu__time_duration.sum')) / 1e3:7.2f}"
            f" dram% {field('dram__throughput.avg.pct_of_peak_sustained_elapsed'):>6s}"
            f" MB {number(field('dram__bytes_read.sum')) / 1e6:7.2f}"
            f" warps/sm {field('sm__warps_active.avg.per_cycle_active'):>6s}"
            f" issue {field('smsp__issue_active.avg.per_cycle_active'):>5s}"
            f" lsb {field('smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio'):>6s}"
            f" active/elapsed {active:.2f}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
