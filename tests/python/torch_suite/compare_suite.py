"""Compares two run_suite.py reports: every test that passed with gloo must
pass with halka unless expectations.txt lists it (differ) with a reason,
and every test halka skips must be skipped for a reason that file lists
(skip) and be skipped with gloo too. A listed test that passes with halka
fails the comparison (the list must say what is true now). Prints one line
per test that differs, and a summary."""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load_expectations(path):
    """({test: why} expected to differ, [(skip reason prefix, why)])."""
    differ, skips = {}, []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            kind, _, rest = line.partition(" ")
            what, bar, why = rest.partition("|")
            if kind not in ("differ", "skip") or not bar or not why.strip():
                sys.exit(f"{path}:{n}: expected 'differ TEST | why' or "
                         f"'skip REASON | why'")
            if kind == "differ":
                differ[what.strip()] = why.strip()
            else:
                skips.append((what.strip(), why.strip()))
    return differ, skips


def compare(gloo, halka, differ, skips):
    """Returns (problems, summary lines)."""
    problems, lines = [], []
    g, h = gloo["tests"], halka["tests"]
    # Both runs must have run the same tests, and gloo must have passed
    # some: an empty or broken selection proves nothing.
    if set(g) != set(h):
        problems.append(f"the runs differ in their tests: only gloo: "
                        f"{sorted(set(g) - set(h))[:5]}, only halka: "
                        f"{sorted(set(h) - set(g))[:5]}")
    if not any(t["outcome"] == "pass" for t in g.values()):
        problems.append(f"gloo passed none of the {len(g)} tests selected")
    for name in sorted(set(g) | set(h)):
        go = g.get(name, {}).get("outcome", "absent")
        ho = h.get(name, {}).get("outcome", "absent")
        if ho == "skip":
            reason = h[name].get("detail", "")
            if not any(reason.startswith(p) for p, _ in skips):
                problems.append(f"{name}: skipped with halka for a reason "
                                f"expectations.txt does not list: {reason!r}")
            elif go != "skip":
                problems.append(f"{name}: skipped with halka ({reason!r}), "
                                f"{go} with gloo")
            continue
        if name in differ:
            if ho == "pass":
                problems.append(f"{name}: listed as expected to differ "
                                f"({differ[name]}) but passes with halka")
            else:
                lines.append(f"{name}: gloo {go}, halka {ho}: expected "
                             f"({differ[name]})")
            continue
        if go == "pass" and ho != "pass":
            detail = h.get(name, {}).get("detail", "").strip().splitlines()
            said = [l for l in detail if "Error" in l or "Exception" in l]
            problems.append(f"{name}: passes with gloo, {ho} with halka: "
                            + (said[-1] if said else
                               detail[-1] if detail else ""))
        elif go != ho:
            lines.append(f"{name}: gloo {go}, halka {ho}")
    return problems, lines


def log_of(log_path, name, lines=150):
    """The last `lines` lines unittest's log holds for test `name` (from its
    "name (...) ..." line to the next test's or to unittest's summary): its processes' stderr, the
    harness's traceback of a process that timed out, halka's log lines."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read().splitlines()
    except OSError as e:
        return [f"(no log: {e})"]
    seg, inside = [], False
    for line in text:
        starts = line.startswith("test_") and " (__main__." in line
        if starts:
            inside = line.startswith(name + " (")
        elif line.startswith(("======", "------", "Ran ")):
            inside = False  # unittest's summary after the last test
        if inside:
            seg.append(line)
    return seg[-lines:] if seg else [f"(no lines for {name} in {log_path})"]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("gloo")
    p.add_argument("halka")
    p.add_argument("expectations", nargs="?",
                   default=os.path.join(HERE, "expectations.txt"))
    p.add_argument("--log", help="halka's run_suite.py log: print each "
                   "failing test's lines")
    args = p.parse_args(argv[1:])
    log = args.log
    gloo = json.load(open(args.gloo))
    halka = json.load(open(args.halka))
    differ, skips = load_expectations(args.expectations)
    problems, lines = compare(gloo, halka, differ, skips)
    def count(r, outcome):
        return sum(1 for t in r["tests"].values() if t["outcome"] == outcome)
    print(f"torch {halka['torch']}, world {halka['world_size']}: "
          f"{len(halka['tests'])} tests; passed: gloo {count(gloo, 'pass')}, "
          f"halka {count(halka, 'pass')}; skipped: gloo {count(gloo, 'skip')}, "
          f"halka {count(halka, 'skip')}; {len(problems)} problem(s)")
    for line in lines:
        print("  " + line)
    for p in problems:
        print("PROBLEM " + p)
    if log is not None:
        # What halka's run printed for each failing test, so that a
        # failure on a machine whose logs are gone still says where.
        for name in sorted({p.split(":", 1)[0] for p in problems}):
            if name in halka["tests"]:
                seg = log_of(log, name, lines=100000)
                print(f"--- halka's log of {name} (last lines) ---")
                print("\n".join(seg[-150:]))
                # Then its warnings and errors alone, last: a CI page that
                # shows only a log's head and tail still shows them.
                alerts = [line[:300] for line in seg
                          if line.startswith(("W ", "E ", "F "))
                          and "left; waiting" not in line]
                print(f"--- halka's warnings and errors in {name} "
                      f"({len(alerts)}; the last 30) ---")
                print("\n".join(alerts[-30:]))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
