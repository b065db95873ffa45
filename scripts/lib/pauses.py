#!/usr/bin/env python3
"""The pause a program saw across a router's hand-over, from what it wrote: one line for a
test to print beside the router's own pause (docs/handover.md). The hand-over is a window
FROM..TO in Unix seconds (hand-over_window in scripts/lib/cluster.sh).

  waits LOG [FROM TO]
      A verbs program run with FFV_REPORT_WAITS=1 (perftest, UCX, any other): the library
      printed at its exit the longest its send queues waited with work outstanding, and when
      each of the longest began (send_waits.h). With the window, the longest of those that
      overlaps it, and their sum when several do (a stall in which a WQE retires now and then
      shows as several waits); when none does, the waits were shorter than the shortest kept.
  iperf3 JSON STARTED FROM TO
      An iperf3 client started at STARTED and run with -J and short intervals (-i 0.1): its
      slowest interval across the window against the median pace of the 2 s around it, and
      the longest stop that interval can hold. An estimate: on this busy machine intervals
      vary by themselves, and a slower interval may be the scheduler's doing.

Exits 1 when the file holds no figure, 2 on a wrong command line.
"""

import functools
import json
import re
import statistics
import sys


WAITS = re.compile(r"FFV_REPORT_WAITS: the longest a send queue waited with work outstanding: "
                   r"[\d.]+ ms \(QP 0x[0-9a-f]+; (\d+) work requests retired\); the longest, "
                   r"each from when it began \(Unix time\): (.*)$", re.M)
KEPT = re.compile(r"([\d.]+) ms from ([\d.]+) \(QP (0x[0-9a-f]+)\)")


def waits(path, window=None):
    """The longest wait of the library's report; with a window (FROM, TO in Unix seconds), the
    longest of the waits it kept that overlaps the window, or, when none does, the bound the
    shortest kept wait gives (those across it were shorter, or it would have been kept)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        m = WAITS.search(f.read())
    if m is None:
        return None
    kept = [(float(ms), float(began)) for ms, began, _ in KEPT.findall(m.group(2))]
    if not kept:
        return None
    if window is None:
        return f"longest send-queue wait {kept[0][0]:.2f} ms ({m.group(1)} work requests)"
    lo, hi = window
    over = [ms for ms, began in kept if began <= hi and began + ms / 1000 >= lo]
    longest = f"the run's longest {kept[0][0]:.2f} ms, {m.group(1)} work requests"
    if over:
        # One stall can show as several waits, when a WQE retires now and then meanwhile.
        more = ""
        if len(over) > 1:
            more = f", {len(over)} of its 8 longest waits across it, {sum(over):.0f} ms in all"
        return f"longest send-queue wait across it {max(over):.2f} ms{more} ({longest})"
    if int(m.group(1)) <= len(kept):  # every wait was kept
        return f"no send-queue work across it ({longest})"
    if kept[-1][0] < 0.01:
        return f"no send-queue wait across it as long as 0.01 ms ({longest})"
    return f"every send-queue wait across it at most {kept[-1][0]:.2f} ms ({longest})"


def iperf3(path, started, window):
    """The slowest of the intervals that overlap the window, an iperf3 client started at Unix
    time `started` (its intervals count from its connection, a few ms later), against the
    median pace of the 2 s on either side: a stream that stopped for t seconds of an interval
    of length T and otherwise kept that pace moved (T - t) / T of it, so t is at most
    T * (1 - slowest / median). A stop of a whole interval or more shows as one without bytes."""
    with open(path, encoding="utf-8") as f:
        intervals = json.load(f).get("intervals", [])
    sums = [i["sum"] for i in intervals if "sum" in i and i["sum"]["seconds"] > 0]
    lo, hi = window

    def near(s, a, b):
        return started + s["start"] <= b and started + s["end"] >= a

    inside = [s for s in sums if near(s, lo, hi)]
    around = [s["bytes"] / s["seconds"] for s in sums
              if near(s, lo - 2, hi + 2) and not near(s, lo, hi)]
    if not inside or len(around) < 3:
        return None
    pace = statistics.median(around)
    slowest = min(inside, key=lambda s: s["bytes"] / s["seconds"])
    rate = slowest["bytes"] / slowest["seconds"]
    empty = sum(1 for s in inside if s["bytes"] == 0)
    stop = slowest["seconds"] * max(1 - rate / pace, 0.0)
    return (f"slowest of its {len(inside)} intervals across it {rate * 8 / 1e9:.2f} Gbit/s, "
            f"{100 * rate / pace:.0f}% of the median {pace * 8 / 1e9:.2f} Gbit/s of the 2 s around"
            f" ({empty} without bytes): a stop within it at most about {stop * 1000:.0f} ms")


USAGE = "waits LOG [FROM TO] | iperf3 JSON STARTED FROM TO (times in Unix seconds)"


def main(argv):
    try:
        kind, path, times = argv[1], argv[2], [float(t) for t in argv[3:]]
    except (IndexError, ValueError):
        kind, times = None, []
    if kind == "waits" and len(times) in (0, 2):
        run = functools.partial(waits, path, tuple(times) if times else None)
    elif kind == "iperf3" and len(times) == 3:
        run = functools.partial(iperf3, path, times[0], (times[1], times[2]))
    else:
        print(f"usage: {argv[0]} {USAGE}", file=sys.stderr)
        return 2
    try:
        text = run()
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"no pause figure: {path}: {e}")
        return 1
    if text is None:
        print(f"no pause figure: {path}: no figures in it")
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
