"""Checks the reference evaluator against the shared conformance cases.

Why this file exists: the reference is only useful if it is right. The conformance cases carry
expectations checked independently (with numpy and by hand), so running the reference over them
validates its reading of the contract: shapes, values, gradients and error kinds. Cases whose shapes
need more inference than the reference does are reported as unsupported, not as failures.

    python3 tests/reference/check_conformance.py [--cases DIR] [-v]
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CASES = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "conformance",
                                              "cases"))


def close(got, want):
    if isinstance(want, str):
        return (want == "nan" and math.isnan(got)) or \
            (want != "nan" and math.isinf(got) and (got > 0) == (want == "inf"))
    return math.isfinite(got) and abs(got - want) <= 1e-5 + 1e-4 * abs(want)


def check_values(what, got_ev, want, problems):
    got = list(got_ev.v)
    if len(got) != len(want):
        problems.append(f"{what}: {len(got)} cells, expected {len(want)}")
        return
    bad = [j for j, (g, w) in enumerate(zip(got, want)) if not close(g, w)]
    if bad:
        j = bad[0]
        problems.append(f"{what}: cell {j} is {got[j]}, expected {want[j]} ({len(bad)} cells)")


def check_case(case):
    """Returns ("pass" | "fail" | "unsupported" | "skip", detail)."""
    if "doc" not in case or case.get("cli_args"):
        return "skip", "raw text or extra command-line arguments"
    expect = case["expect"]
    try:
        res = reference.evaluate(case["doc"], "f64")
    except reference.DocError as e:
        if expect.get("error_kind") == e.kind:
            return "pass", ""
        return "fail", f"reference error {e.kind}: {e.message}"
    except reference.Unsupported as e:
        return "unsupported", str(e)
    if "error_kind" in expect:
        if expect["error_kind"] == "backend":
            return "skip", "backend errors are the tool's"
        return "fail", f"expected error {expect['error_kind']}, the reference evaluated it"
    problems = []
    if "shape" in expect and res["shape"] != expect["shape"]:
        problems.append(f"shape {res['shape']} != {expect['shape']}")
    if "values" in expect and case["command"] == "eval":
        check_values("values", res["values"], expect["values"], problems)
    for name, n in expect.get("nodes", {}).items():
        got = res["nodes"].get(name)
        if got is None:
            problems.append(f"node {name} missing")
            continue
        if got["shape"] != n["shape"]:
            problems.append(f"node {name} shape {got['shape']} != {n['shape']}")
        if "values" in n:
            check_values(f"node {name}", got["values"], n["values"], problems)
    for name, p in expect.get("params", {}).items():
        got = res["params"].get(name)
        if got is None:
            problems.append(f"param {name} missing")
            continue
        if got["shape"] != p["shape"]:
            problems.append(f"param {name} shape {got['shape']} != {p['shape']}")
        if "values" in p:
            check_values(f"param {name}", got["values"], p["values"], problems)
    for name, g in expect.get("grad", {}).items():
        got = res["params"].get(name, {}).get("grad")
        if got is None:
            problems.append(f"grad {name} missing")
        else:
            check_values(f"grad {name}", got, g, problems)
    return ("fail", "; ".join(problems)) if problems else ("pass", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    counts = {}
    for fn in sorted(os.listdir(args.cases)):
        if not fn.endswith(".json"):
            continue
        case = json.load(open(os.path.join(args.cases, fn)))
        status, detail = check_case(case)
        counts[status] = counts.get(status, 0) + 1
        if status == "fail" or args.verbose:
            print(f"{status.upper()} {case['id']}: {detail}")
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return 1 if counts.get("fail") else 0


if __name__ == "__main__":
    sys.exit(main())
