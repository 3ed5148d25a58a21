#!/usr/bin/env python3
"""Where one operation's time goes, from `halkactl bench --trace FILE`.

  alpha_breakdown.py TRACE.json [--client-us T] [--last N]

Reads the Chrome trace that `halkactl bench --trace` writes (every rank's
timeline: the last 64 operations per rank, core/timeline.h) and prints, as
medians over the last N operations of every rank (default 30: the timed
ones of a --n=30 run), where each operation's time went on the worker:

  ring       the operation on the rank's ring: from the call reaching the
             ring to its end (TraceOp start..end)
  phase X    each phase's span (fingerprint, naive, reduce-scatter, ...)
  send       handing frames to the transport (sum over the operation)
  wait       blocked for a peer's frame (sum)
  reduce     reducing or copying received frames (sum)
  wire       the link writing this rank's frames (sum; on the link's own
             thread, so it overlaps the others)
  other      ring - send - wait - reduce: the engine's own work between
             spans (planning, wake-ups, bookkeeping)

With --client-us (the bench table's time(us) of the same run), it adds
"outside the ring" = client - ring: the SDK's hand-off to the worker, the
worker's turn and the reply, which no span covers.
"""
import argparse
import json
import statistics
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--client-us", type=float, default=None)
    ap.add_argument("--last", type=int, default=30)
    a = ap.parse_args()
    events = json.load(open(a.trace, encoding="utf-8"))["traceEvents"]
    ops = defaultdict(lambda: {"sums": defaultdict(float), "phases": {}})
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        key = (e["pid"], args.get("generation"), args.get("op_seq"))
        cat = e.get("cat")
        if cat == "op":
            ops[key]["ring"] = e["dur"]
            ops[key]["ok"] = args.get("ok", True)
        elif cat == "phase":
            ops[key]["phases"][args.get("phase", e["name"])] = e["dur"]
        elif cat in ("send", "wait", "reduce", "wire", "stall", "window"):
            ops[key]["sums"][cat] += e["dur"]
    by_rank = defaultdict(list)
    for (pid, gen, seq), o in ops.items():
        if "ring" in o and o.get("ok", True):
            by_rank[pid].append((gen or 0, seq or 0, o))
    chosen = []
    for pid, lst in by_rank.items():
        lst.sort(key=lambda x: (x[0], x[1]))
        chosen += [o for _, _, o in lst[-a.last:]]
    if not chosen:
        raise SystemExit("alpha_breakdown: no completed operation in the trace")
    med = lambda xs: statistics.median(xs) if xs else 0.0
    rows = [("ring", med([o["ring"] for o in chosen]))]
    phases = sorted({p for o in chosen for p in o["phases"]})
    for p in phases:
        rows.append((f"  phase {p}", med([o["phases"].get(p, 0) for o in chosen])))
    for cat in ("send", "wait", "reduce", "wire", "stall", "window"):
        vals = [o["sums"].get(cat, 0.0) for o in chosen]
        if any(vals):
            rows.append((f"  {cat}", med(vals)))
    rows.append(("  other", med([o["ring"] - o["sums"]["send"] - o["sums"]["wait"]
                                 - o["sums"]["reduce"] for o in chosen])))
    if a.client_us is not None:
        rows.insert(0, ("client (bench time)", a.client_us))
        rows.append(("outside the ring", a.client_us - rows[1][1]))
    ranks = len(by_rank)
    print(f"# medians over {len(chosen)} operations ({ranks} ranks, last "
          f"{a.last} each), microseconds")
    print("| part | µs |")
    print("|---|---:|")
    for name, v in rows:
        print(f"| {name.strip() if not name.startswith('  ') else '· ' + name.strip()} | {v:.0f} |")


if __name__ == "__main__":
    main()
