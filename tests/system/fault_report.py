#!/usr/bin/env python3
"""Reads halka-fault-driver output and checks a fault scenario.

  fault_report.py ready LOG --since MS --world W --need K
      exit 0 once K operations that started after MS succeeded on exactly
      W ranks, all with world_size W (else 1).
  fault_report.py check LOG --name NAME --slots N [--fault MS --victim ID
      --victim-slot S --bound MS --world-after W] [--heal MS]
      (--victim and --victim-slot may list several, comma-separated: a
      host lost with its workers; an error naming any of them counts)
      [--max-errors N] [--deadline-names ID]
      prints one summary line; exit 1 on a violation:
      - any wrong result or hang;
      - a survivor call in flight at the fault that returned later than
        --bound after it, or failed without naming the victim;
      - no operation correct on --world-after ranks after the fault;
      - with --heal: no operation correct on all --slots ranks after it;
      - more than --max-errors errors (when given);
      - a numbering split: an operation right after one with a bad call
        (outcome=fault, from --bad_calls) on which every call failed with
        "already started operation" / "waits in #", or split > 0 on the
        driver's RESULT line;
      - a numbering split that outlived a round: two or more operations in
        a row whose members' own errors name different operation numbers
        ("rank 1 (w2, ...): all_reduce #202" next to "... #201").
      A bad call's own error (outcome=fault kind=K) is expected: it counts
      neither as an error nor as a wrong; a bad call the worker accepted is
      printed by the driver as a wrong.
"""
import argparse
import re
import sys

LINE = re.compile(r"^call op=(-?\d+) slot=(\d+) t_ms=(\d+) ms=(\d+) "
                  r"outcome=(\w+)(?: kind=(\S+))? gen=(\d+) world=(\d+) "
                  r"rank=(-?\d+)(?: algo=(\S*))? msg=(.*)$")
RESULT = re.compile(r"^RESULT (.*)$")
SPLIT_SIGNS = ("already started operation", "waits in #")
# The operation number a member's own error names.
OWN_NUMBER = re.compile(r"^[A-Z_]+: rank \d+ \([^)]*\): \w+ #(\d+) ")


def load(path):
    calls = []
    result = {}
    with open(path, errors="replace") as f:
        for line in f:
            r = RESULT.match(line.rstrip("\n"))
            if r:
                result = dict(kv.split("=", 1) for kv in r.group(1).split()
                              if "=" in kv)
                continue
            m = LINE.match(line.rstrip("\n"))
            if not m:
                continue
            (op, slot, t, ms, outcome, kind, gen, world, rank, algo,
             msg) = m.groups()
            calls.append(dict(op=int(op), slot=int(slot), t=int(t), ms=int(ms),
                              end=int(t) + int(ms), outcome=outcome,
                              kind=kind or "", gen=int(gen), world=int(world),
                              algo=algo or "", msg=msg))
    ops = {}
    for c in calls:
        if c["op"] >= 0:  # op=-1: a call still running at the end (a hang)
            ops.setdefault(c["op"], []).append(c)
    return calls, [ops[k] for k in sorted(ops)], result


def bad_call_rounds(ops):
    """For each operation with a bad call: (op number, its bad calls, the
    next operation's calls or None)."""
    by_op = {op[0]["op"]: op for op in ops}
    out = []
    for n in sorted(by_op):
        faults = [c for c in by_op[n] if c["outcome"] == "fault"]
        if faults:
            out.append((n, faults, by_op.get(n + 1)))
    return out


def mismatches(ops):
    """Operations whose members' own errors name different operation
    numbers: [(op number, {slot: number})]."""
    out = []
    for op in ops:
        nums = {}
        for c in op:
            m = OWN_NUMBER.match(c["msg"])
            if c["outcome"] not in ("ok", "fault") and m and m.group(1) != "0":
                nums[c["slot"]] = int(m.group(1))
        if len(set(nums.values())) > 1:
            out.append((op[0]["op"], nums))
    return out


def is_split(calls):
    """Every call of the operation failed with a numbering split."""
    return bool(calls) and all(
        c["outcome"] == "error" and any(s in c["msg"] for s in SPLIT_SIGNS)
        for c in calls)


def ok_end(op):
    """When the last successful call of an operation ended (a victim's call
    of the same operation may fail much later: its worker was gone)."""
    return max(c["end"] for c in op if c["outcome"] == "ok")


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
    p.add_argument("--victim-slot", default="")
    p.add_argument("--bound", type=int, default=0)
    p.add_argument("--world-after", type=int, default=0)
    p.add_argument("--heal", type=int, default=0)
    p.add_argument("--max-errors", type=int, default=-1)
    p.add_argument("--deadline-names", default="")
    a = p.parse_args()
    victims = [v for v in a.victim.split(",") if v]
    victim_slots = {int(v) for v in a.victim_slot.split(",") if v}
    calls, ops, result = load(a.log)

    if a.mode == "ready":
        return 0 if len(good_ops(ops, a.since, a.world)) >= a.need else 1

    bad = []
    count = {k: 0 for k in ("ok", "error", "down", "wrong", "hang", "fault")}
    for c in calls:
        count[c["outcome"]] = count.get(c["outcome"], 0) + 1
    for c in calls:
        if c["outcome"] in ("wrong", "hang"):
            bad.append("op %d slot %d: %s: %s" % (c["op"], c["slot"],
                                                 c["outcome"], c["msg"]))
    parts = []
    if a.fault:
        inflight = [c for c in calls if c["slot"] not in victim_slots
                    and c["t"] <= a.fault <= c["end"]]
        if not inflight:  # the fault fell between operations
            after = [c for c in calls if c["slot"] not in victim_slots
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
            if victims and not any(v in c["msg"] for v in victims):
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
                                        (ok_end(rec[0]) -
                                         a.fault) / 1000.0))
        else:
            bad.append("no operation succeeded on %d ranks after the fault" %
                       a.world_after)
    if a.heal:
        back = good_ops(ops, a.heal, a.slots)
        if back:
            parts.append("first correct op on all %d ranks ended %.2f s "
                         "after the heal/restart" %
                         (a.slots, (ok_end(back[0]) - a.heal)
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
    rounds = bad_call_rounds(ops)
    if rounds:
        kinds = {}
        for _, faults, _ in rounds:
            for c in faults:
                kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
        followed = [r for r in rounds if r[2]]
        recovered = [r for r in followed
                     if all(c["outcome"] == "ok" for c in r[2])]
        splits = [r for r in followed if is_split(r[2])]
        for n, faults, nxt in splits:
            bad.append("numbering split: op %d after the bad call (%s on "
                       "slot %d) of op %d: %s" % (
                           n + 1, faults[0]["kind"], faults[0]["slot"], n,
                           " | ".join("slot %d: %s" % (c["slot"], c["msg"][:200])
                                      for c in nxt)))
        parts.append("bad calls %d (%s): the next op correct on every "
                     "member after %d of %d, split %d" % (
                         sum(kinds.values()),
                         ", ".join("%s %d" % kv for kv in sorted(kinds.items())),
                         len(recovered), len(followed), len(splits)))
        failed = [r for r in followed if r not in recovered]
        if failed:
            n, faults, nxt = failed[0]
            err = [c for c in nxt if c["outcome"] != "ok"][0]
            parts.append('e.g. op %d after a bad call: slot %d %s "%s"' % (
                n + 1, err["slot"], err["outcome"], err["msg"][:200]))
    mm = mismatches(ops)
    if mm:
        runs, cur = [], [mm[0]]
        for x in mm[1:]:
            if x[0] == cur[-1][0] + 1:
                cur.append(x)
            else:
                runs.append(cur)
                cur = [x]
        runs.append(cur)
        longest = max(runs, key=len)
        parts.append("ops with members numbered apart: %d (longest run %d)" %
                     (len(mm), len(longest)))
        by_op = {op[0]["op"]: op for op in ops}
        for r in runs:
            if len(r) > 1:
                # What each slot saw in the op before the split and in its
                # first op: the call that put a rank out of step.
                seen = []
                for n in (r[0][0] - 1, r[0][0]):
                    for c in sorted(by_op.get(n, []), key=lambda c: c["slot"]):
                        seen.append("op %d slot %d %s: %s" % (
                            n, c["slot"], c["outcome"], c["msg"][:160]))
                bad.append("numbering split outlived a round: ops %d..%d, "
                           "e.g. op %d: %s\n    %s" % (
                               r[0][0], r[-1][0], r[0][0],
                               ", ".join("slot %d at #%d" % kv
                                         for kv in sorted(r[0][1].items())),
                               "\n    ".join(seen)))
    driver_split = int(result.get("split", "0") or 0)
    if driver_split > 0:
        bad.append("the driver counted %d numbering split(s)" % driver_split)
    errs = [c for c in calls if c["outcome"] in ("error", "down")]
    if errs and not a.fault:
        parts.append('first error: "%s"' % errs[0]["msg"][:200])
    times = [c["ms"] for c in calls if c["outcome"] == "ok"]
    parts.append("ops %d, calls ok=%d error=%d down=%d wrong=%d hang=%d%s, "
                 "ok call median %d ms" % (
                     len(ops), count["ok"], count["error"], count["down"],
                     count["wrong"], count["hang"],
                     " fault=%d" % count["fault"] if count["fault"] else "",
                     sorted(times)[len(times) // 2] if times else 0))
    print("SCENARIO %s: %s" % (a.name, "; ".join(parts)))
    for b in bad:
        print("  VIOLATION: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
