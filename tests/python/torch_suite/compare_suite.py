"""Compares two run_suite.py reports: every test that passed with gloo must
pass with halka, unless expected_differences.txt lists it with a reason.
A listed test that passes with halka fails the comparison too (the list
must say what is true now). Prints one line per test that differs."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load_expected(path):
    """{test name: reason} from lines "test_name  reason" (# comments)."""
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, reason = line.partition(" ")
            if not reason.strip():
                sys.exit(f"{path}:{n}: {name} has no reason")
            out[name] = reason.strip()
    return out


def compare(gloo, halka, expected):
    """Returns (problems, summary lines)."""
    problems, lines = [], []
    g, h = gloo["tests"], halka["tests"]
    for name in sorted(set(g) | set(h)):
        go = g.get(name, {}).get("outcome", "absent")
        ho = h.get(name, {}).get("outcome", "absent")
        if name in expected:
            if ho == "pass":
                problems.append(f"{name}: listed as expected to differ "
                                f"({expected[name]}) but passes with halka")
            else:
                lines.append(f"{name}: gloo {go}, halka {ho}: expected "
                             f"({expected[name]})")
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


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit("usage: compare_suite.py gloo.json halka.json "
                 "[expected_differences.txt]")
    gloo = json.load(open(argv[1]))
    halka = json.load(open(argv[2]))
    exp = load_expected(argv[3] if len(argv) == 4 else
                        os.path.join(HERE, "expected_differences.txt"))
    problems, lines = compare(gloo, halka, exp)
    passed = {k: sum(1 for t in r["tests"].values() if t["outcome"] == "pass")
              for k, r in (("gloo", gloo), ("halka", halka))}
    print(f"torch {halka['torch']}, world {halka['world_size']}: "
          f"{len(halka['tests'])} tests; passed: gloo {passed['gloo']}, "
          f"halka {passed['halka']}; {len(problems)} problem(s)")
    for line in lines:
        print("  " + line)
    for p in problems:
        print("PROBLEM " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
