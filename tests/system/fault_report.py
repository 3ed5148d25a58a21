#!/usr/bin/env python3
"""Reads halka-fault-driver output and checks a fault scenario.

  fault_report.py ready LOG --since MS --world W --need K
      exit 0 once K operations that started after MS succeeded on exactly
      W ranks, all with world_size W (else 1).
  fault_report.py check LOG --name NAME --slots N [--fault MS --victim ID
      --victim-slot S --bound MS --world-after W] [--heal MS]
      [--max-errors N] [--deadline-names ID]
      prints one summary line; exit 1 on a violation:
      - any wrong result or hang;
      - a survivor call in flight at the fault that returned later than
        --bound after it, or failed without naming the victim;
      - no operation correct on --world-after ranks after the fault;
      - with --heal: no operation correct on all --slots ranks after it;
      - more than --max-errors errors (when given).
"""
import argparse
import re
import sys

LINE = re.compile(r"^call op=(\d+) slot=(\d+) t_ms=(\d+) ms=(\d+) "
                  r"outcome=(\w+) gen=(\d+) world=(\d+) rank=(-?\d+) msg=(.*)$")


def load(path):
    calls = []
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if not m:
                continue
            op, slot, t, ms, outcome, gen, world, rank, msg = m.groups()
            calls.append(dict(op=int(op), slot=int(slot), t=int(t), ms=int(ms),
                              end=int(t) + int(ms), outcome=outcome,
                              gen=int(gen), world=int(world), msg=msg))
    ops = {}
    for c in calls:
        ops.setdefault(c["op"], []).append(c)
    return calls, [ops[k] for k in sorted(ops)]


def good_ops(ops, since, world):
    """Operations started after `since` that succeeded on exactly `world`
    ranks, every one reporting that world size."""
    out = []
    for op in ops:
        if min(c["t"] for c in op) < since:
            continue
        ok = [c for c in op if c["outcome"] == "ok"]
        if len(ok) == world and all(c["world"] == world for c in ok):
            out.append(op)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["ready", "check"])
    p.add_argument("log")
    p.add_argument("--since", type=int, default=0)
    p.add_argument("--world", type=int, default=0)
    p.add_argument("--need", type=int, default=1)
    p.add_argument("--name", default="")
    p.add_argument("--slots", type=int, default=0)
    p.add_argument("--fault", type=int, default=0)
    p.add_argument("--victim", default="")
    p.add_argument("--victim-slot", type=int, default=-1)
    p.add_argument("--bound", type=int, default=0)
    p.add_argument("--world-after", type=int, default=0)
    p.add_argument("--heal", type=int, default=0)
    p.add_argument("--max-errors", type=int, default=-1)
    p.add_argument("--deadline-names", default="")
    a = p.parse_args()
    calls, ops = load(a.log)

    if a.mode == "ready":
        return 0 if len(good_ops(ops, a.since, a.world)) >= a.need else 1

    bad = []
    count = {k: 0 for k in ("ok", "error", "down", "wrong", "hang")}
    for c in calls:
        count[c["outcome"]] = count.get(c["outcome"], 0) + 1
    for c in calls:
        if c["outcome"] in ("wrong", "hang"):
            bad.append("op %d slot %d: %s: %s" % (c["op"], c["slot"],
                                                 c["outcome"], c["msg"]))
    parts = []
    if a.fault:
        inflight = [c for c in calls if c["slot"] != a.victim_slot
                    and c["t"] <= a.fault <= c["end"]]
        if not inflight:  # the fault fell between operations
            after = [c for c in calls if c["slot"] != a.victim_slot
                     and c["t"] > a.fault]
            first = min((c["op"] for c in after), default=None)
            inflight = [c for c in after if c["op"] == first]
        slowest = max((c["end"] - a.fault for c in inflight), default=0)
        errors = [c for c in inflight if c["outcome"] == "error"]
        for c in inflight:
            if c["end"] - a.fault > a.bound:
                bad.append("op %d slot %d returned %d ms after the fault "
                           "(bound %d ms)" % (c["op"], c["slot"],
                                              c["end"] - a.fault, a.bound))
        for c in errors:
            if a.victim not in c["msg"]:
                bad.append("op %d slot %d failed without naming %s: %s" %
                           (c["op"], c["slot"], a.victim, c["msg"]))
        parts.append("%d survivor calls in flight at the fault: %d failed "
                     "naming %s, all returned within %.2f s (bound %.1f s)" %
                     (len(inflight), len(errors), a.victim, slowest / 1000.0,
                      a.bound / 1000.0))
        if errors:
            parts.append('e.g. "%s"' % errors[0]["msg"][:240])
        rec = good_ops(ops, a.fault, a.world_after)
        if rec:
            parts.append("first correct op on %d ranks ended %.2f s after "
                         "the fault" % (a.world_after,
                                        (max(c["end"] for c in rec[0]) -
                                         a.fault) / 1000.0))
        else:
            bad.append("no operation succeeded on %d ranks after the fault" %
                       a.world_after)
    if a.heal:
        back = good_ops(ops, a.heal, a.slots)
        if back:
            parts.append("first correct op on all %d ranks ended %.2f s "
                         "after the heal/restart" %
                         (a.slots, (max(c["end"] for c in back[0]) - a.heal)
                          / 1000.0))
        else:
            bad.append("no operation succeeded on all %d ranks after the "
                       "heal/restart" % a.slots)
    if a.max_errors >= 0 and count["error"] + count["down"] > a.max_errors:
        bad.append("%d errors (at most %d expected): %s" % (
            count["error"] + count["down"], a.max_errors,
            "; ".join(sorted({c["msg"][:160] for c in calls
                              if c["outcome"] in ("error", "down")})[:3])))
    if a.deadline_names:
        errs = [c for c in calls if c["outcome"] == "error"]
        if not errs:
            bad.append("no operation hit its deadline")
        elif not any(a.deadline_names in c["msg"] for c in errs):
            bad.append("no deadline error names %s" % a.deadline_names)
        for c in errs:
            if not c["msg"].startswith(("DEADLINE_EXCEEDED", "ABORTED")):
                bad.append("unexpected error: %s" % c["msg"][:200])
    errs = [c for c in calls if c["outcome"] in ("error", "down")]
    if errs and not a.fault:
        parts.append('first error: "%s"' % errs[0]["msg"][:200])
    times = [c["ms"] for c in calls if c["outcome"] == "ok"]
    parts.append("ops %d, calls ok=%d error=%d down=%d wrong=%d hang=%d, "
                 "ok call median %d ms" % (
                     len(ops), count["ok"], count["error"], count["down"],
                     count["wrong"], count["hang"],
                     sorted(times)[len(times) // 2] if times else 0))
    print("SCENARIO %s: %s" % (a.name, "; ".join(parts)))
    for b in bad:
        print("  VIOLATION: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
