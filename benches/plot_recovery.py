#!/usr/bin/env python3
"""Plots `weir-bench recovery` results as an SVG (no dependencies beyond Python 3).

Usage: python3 benches/plot_recovery.py [--all-subtasks] [--log] results.jsonl docs/images/recovery.svg

Each input line is one JSON object printed by `weir-bench recovery` or by Flink's side of it
(`bash benches/flink.sh recovery`, drawn dashed). The plot shows the time from process start
to the first record processed (with `--all-subtasks`: until every subtask has had one; the
median where one kind of restart ran several times at a size) against the state size, one
line per kind of restart: same parallelism with local recovery, same parallelism from
checkpoint storage (from the page cache, and with `--cold` from disk), and rescaled 2 -> 3.
With `--log` the time axis is logarithmic.
"""

import json
import math
import sys

W, H = 780, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 310, 30, 60


def series_of(run):
    who = "Flink: " if run["job"] == "flink-recovery" else ""
    # Flink's settings given with --conf, by the last part of their keys.
    conf = "".join(" (%s)" % c.split("=")[0].split(".")[-1] for c in run.get("conf") or [])
    if run["restore_parallelism"] != run["parallelism"]:
        return who + "rescale %d -> %d%s" % (run["parallelism"], run["restore_parallelism"], conf)
    if run["local_recovery"] and run.get("local_copies_used"):
        return who + "same parallelism, local copy"
    if run.get("cold"):
        return who + "from storage, cold disk"
    return who + "same parallelism, from storage"


def median(xs):
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


COLORS = {
    "same parallelism, local copy": "#1b9e77",
    "same parallelism, from storage": "#7570b3",
    "from storage, cold disk": "#e7298a",
}


def main(src, dst, metric="first_record_s", log=False):
    series = {}
    with open(src) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            run = json.loads(line)
            # The restored checkpoint's size where the run reports it.
            gb = (run.get("checkpoint_bytes") or run["state_bytes"]) / 1e9
            series.setdefault(series_of(run), []).append((gb, run[metric]))
    # Several runs of one kind at one size (same checkpoint) become their median.
    for name, pts in series.items():
        by_size = {}
        for gb, y in pts:
            by_size.setdefault(round(gb, 2), []).append(y)
        series[name] = [(gb, median(ys)) for gb, ys in by_size.items()]
    xmax = max(x for pts in series.values() for x, _ in pts) * 1.1
    ymax = max(max(y for pts in series.values() for _, y in pts) * 1.2, 2.5)
    # A logarithmic axis runs over whole decades, from below the fastest run.
    lo = 10 ** math.floor(math.log10(min(y for pts in series.values() for _, y in pts)))
    hi = 10 ** math.ceil(math.log10(ymax))

    def sx(x):
        return LEFT + x / xmax * (W - LEFT - RIGHT)

    def sy(y):
        if log:
            frac = (math.log10(max(y, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        else:
            frac = y / ymax
        return H - BOTTOM - frac * (H - TOP - BOTTOM)

    out = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
        'font-family="sans-serif" font-size="12">' % (W, H),
        '<rect width="100%" height="100%" fill="white"/>',
        '<text x="%d" y="18" font-size="14">weir-bench recovery: process start to %s '
        "(2 cores)</text>"
        % (LEFT, "every subtask's first record" if metric == "all_subtasks_s" else "first record"),
    ]
    # Axes, ticks and grid.
    out.append(
        '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>'
        % (LEFT, H - BOTTOM, W - RIGHT, H - BOTTOM)
    )
    out.append(
        '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>'
        % (LEFT, TOP, LEFT, H - BOTTOM)
    )
    steps = 5
    if log:
        decades = round(math.log10(hi / lo))
        yticks = [lo * 10**i for i in range(decades + 1)]
    else:
        yticks = [ymax * i / steps for i in range(steps + 1)]
    for y in yticks:
        out.append(
            '<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
            % (LEFT, sy(y), W - RIGHT, sy(y))
        )
        out.append(
            '<text x="%d" y="%.1f" text-anchor="end">%s</text>'
            % (LEFT - 6, sy(y) + 4, ("%g" % y) if log else ("%.1f" % y))
        )
    for i in range(steps + 1):
        x = xmax * i / steps
        out.append(
            '<text x="%.1f" y="%d" text-anchor="middle">%.1f</text>'
            % (sx(x), H - BOTTOM + 16, x)
        )
    out.append(
        '<text x="%d" y="%d" text-anchor="middle">state in checkpoint storage (GB)</text>'
        % ((LEFT + W - RIGHT) // 2, H - 20)
    )
    out.append(
        '<text x="18" y="%d" transform="rotate(-90 18 %d)" text-anchor="middle">'
        "seconds%s</text>"
        % ((TOP + H - BOTTOM) // 2, (TOP + H - BOTTOM) // 2, " (log scale)" if log else "")
    )
    # The targets: 2 s at 1 GB, 10 s at 10 GB (without rescale).
    for gb, s in ((1, 2), (10, 10)):
        if gb <= xmax and s <= (hi if log else ymax):
            out.append(
                '<circle cx="%.1f" cy="%.1f" r="5" fill="none" stroke="red"/>' % (sx(gb), sy(s))
            )
    for i, (name, pts) in enumerate(sorted(series.items())):
        flink = name.startswith("Flink: ")
        color = COLORS.get(name[len("Flink: "):] if flink else name, "#d95f02")
        if name.endswith(")"):
            color = "#e6ab02"  # a setting given with --conf
        dash = ' stroke-dasharray="6,4"' if flink else ""
        pts.sort()
        path = " ".join("%.1f,%.1f" % (sx(x), sy(y)) for x, y in pts)
        out.append(
            '<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>' % (path, color, dash)
        )
        for x, y in pts:
            out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (sx(x), sy(y), color))
        ly = TOP + 10 + 22 * i
        out.append(
            '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>'
            % (W - RIGHT + 10, ly, W - RIGHT + 28, ly, color, dash)
        )
        out.append('<text x="%d" y="%d" font-size="11">%s</text>' % (W - RIGHT + 32, ly + 4, name))
    out.append(
        '<text x="%d" y="%d" fill="red">o target (no rescale)</text>'
        % (W - RIGHT + 10, TOP + 14 + 22 * len(series))
    )
    out.append("</svg>")
    with open(dst, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(paths) != 2 or not set(flags) <= {"--all-subtasks", "--log"}:
        sys.exit(__doc__)
    metric = "all_subtasks_s" if "--all-subtasks" in flags else "first_record_s"
    main(paths[0], paths[1], metric, "--log" in flags)
