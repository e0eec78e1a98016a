"""Differential test of ``rocannl eval`` against the numpy reference evaluator.

Why this file exists: it is the driver. It generates seeded random documents
(``generator.py``), runs the binary on each backend and precision, and compares the root's values,
every named node, every param's values and shape, and every param gradient with the reference
(``reference.py``) under the tolerance explained in ``compare.py``. It also checks the reference's
own gradients against central finite differences in f64, so that a wrong hand-derived rule shows
up as a failure of the reference rather than of the tool.

A mismatch is minimized (``minimize.py``), printed and saved under ``failures/``. Documents kept
in ``regressions/`` (one file per failing document of a sample, with the defect it shows, see the
README there) make their mismatches known: a known mismatch is reported but does not fail the run.
The exit status is 1 only for new mismatches and for defects of the test itself (the reference
rejecting a generated document, a finite-difference disagreement). ``--record`` writes the new
mismatches of a run as regression files, for a person to review and describe.

    python3 tests/reference/difftest.py --bin target/release/rocannl --seed 1 --count 200 \\
        --backends interp,gccjit --precisions f32,f64

Replaying documents (e.g. the regression documents): ``--replay FILE...``.
"""

import argparse
import concurrent.futures
import hashlib
import json
import math
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
import generator  # noqa: E402
import minimize  # noqa: E402
import reference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REGRESSIONS = os.path.join(HERE, "regressions")
TOOL_CATEGORIES = ("rejected", "crash", "shape", "value", "grad")

# Finite differences of the reference in f64: central differences D(h) and D(h/2) with
# h = 1e-5·max(1, |x|), extrapolated (Richardson) to fd = (4·D(h/2) - D(h))/3, which cancels the
# h² term of the truncation error: a steep composition such as sin(x^-2.7) at x = 0.16 has
# h²·|f'''|/6 of 1e-4 relative, the extrapolation about 1e-9. The rounding error is about
# 1e-16·Σ|root|/h. A cell passes when
# |fd - grad| <= FD_RTOL·max(|fd|, |grad|) + FD_ATOL·(1 + Σ|root cells|).
FD_STEP = 1e-5
FD_RTOL = 1e-4
FD_ATOL = 1e-9


def doc_id(doc):
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def load_known():
    """(document id, backend, precision, category) of every known mismatch: each regression file
    names the sample document it came from and its own (minimized) document."""
    known = {}
    if not os.path.isdir(REGRESSIONS):
        return known
    for fn in sorted(os.listdir(REGRESSIONS)):
        if not fn.endswith(".json"):
            continue
        reg = json.load(open(os.path.join(REGRESSIONS, fn)))
        for f in reg["fails"]:
            for i in (reg.get("sample_id"), doc_id(reg["doc"])):
                if i:
                    known[(i, f["backend"], f["precision"], f["category"])] = fn
    return known


def suggest_defect(doc, fails):
    """A first guess at which known defect a mismatching document shows (for --record)."""
    text = json.dumps(doc)
    where = {(f["backend"], f["precision"]) for f in fails}
    cats = {f["category"] for f in fails}
    details = " ".join(f.get("detail", "") for f in fails)
    specs = [e.get("spec", "") for _, e in minimize.walk(doc["expr"]) if isinstance(e, dict)]
    if "leaf" in doc["expr"]:
        return "root-leaf"
    for spec in specs:
        for item in re.findall(r"\w+(?:\^\w+)+", spec):
            if len(set(item.split("^"))) < item.count("^") + 1:
                return "concat-repeat"
    if "rejected" in cats and "batch slice" in details:
        return "slice-multi-batch"
    if "rejected" in cats and any("*" in s for s in specs) and \
            ("fixed index" in details or "concatenated axis" in details):
        return "stride-over-open-size"
    if "rejected" in cats and "has more axes than []" in details:
        return "row-variable-chain"
    if "rejected" in cats and "needs" in details and "elements" in details:
        return "param-bound-by-placement"
    if where == {("interp", "f32")}:
        return "interp-f32-in-f64"
    if where <= {("gccjit", "f32"), ("gccjit", "f64")} and '"where"' in text:
        return "gccjit-where"
    if where <= {("gccjit", "f32"), ("gccjit", "f64")} and cats == {"value"}:
        return "gccjit-inline-compare"
    if where <= {("gccjit", "f32"), ("gccjit", "f64")} and cats == {"grad"} and \
            ('"min"' in text or '"max"' in text):
        return "gccjit-minmax-grad"
    if any("+" in s for s in specs):
        return "conv-kernel-1"
    if cats <= {"shape", "value"} and len(where) >= 4 and any("^" in s for s in specs):
        return "concat-bound-widening"
    return "unclassified"


def md_cell(text):
    return str(text).replace("|", "\\|")


def update_readme():
    """Rewrites the tables of regressions/README.md (defects, then one line per document) from
    the files; the text before them is kept."""
    path = os.path.join(REGRESSIONS, "README.md")
    head = open(path).read().split("## Defects")[0]
    regs = []
    for fn in sorted(os.listdir(REGRESSIONS)):
        if fn.endswith(".json"):
            reg = json.load(open(os.path.join(REGRESSIONS, fn)))
            reg["file"] = fn
            regs.append(reg)
    defects = {}
    for reg in regs:
        defects.setdefault(reg["defect"], reg)
    lines = ["## Defects", "", "| defect | status | what goes wrong |", "|---|---|---|"]
    for key, reg in sorted(defects.items(), key=lambda kv: (kv[1].get("status") != "known, "
                                                               "being fixed", kv[0])):
        lines.append(f"| `{key}` | {reg.get('status', '')} | {md_cell(reg['description'])} |")
    lines += ["", "## Documents", "", "| file | defect | fails on | sample |", "|---|---|---|---|"]
    for reg in sorted(regs, key=lambda r: (r["defect"], r["sample"] == "", r["file"])):
        evals = [f for f in reg["fails"] if f["backend"] != "shapes"]
        cats = {}
        for f in evals:
            cats.setdefault(f["category"], []).append(f"{f['backend']}/{f['precision']}")
        if len(evals) == 4 and len(cats) == 1:
            where = f"{next(iter(cats))}: all four"
        else:
            where = "; ".join(f"{c}: {', '.join(sorted(v))}" for c, v in sorted(cats.items()))
        shapes = [f for f in reg["fails"] if f["backend"] == "shapes"]
        if shapes:
            where += f"; `shapes`: {shapes[0]['category']}"
        lines.append(f"| `{reg['file']}` | {md_cell(reg.get('summary', reg['defect']))} | {where} "
                     f"| {reg['sample'] or 'reduced by hand'} |")
    with open(path, "w") as f:
        f.write(head + "\n".join(lines) + "\n")


def record(results, opts):
    """Writes each document with new mismatches as a regression file; prints README lines."""
    os.makedirs(REGRESSIONS, exist_ok=True)
    lines = []
    for r in results:
        bad = [e for e in r["runs"] if e["category"] in TOOL_CATEGORIES and not e.get("known")]
        if not bad:
            continue
        m = r.get("minimized")
        small = m["doc"] if m else r["doc"]
        fails = [{"backend": e["backend"], "precision": e["precision"],
                  "category": e["category"]} for e in bad]
        defect = suggest_defect(small, [dict(f, detail=e["detail"]) for f, e in zip(fails, bad)])
        fn = f"{defect}-{r['id']}.json"
        reg = {"defect": defect, "status": "", "summary": "", "description": "",
               "sample": r["label"], "sample_id": r["id"], "fails": fails, "doc": small}
        with open(os.path.join(REGRESSIONS, fn), "w") as f:
            json.dump(reg, f, indent=1)
            f.write("\n")
        where = ", ".join(sorted({f"{e['backend']}/{e['precision']}" for e in bad}))
        cats = ", ".join(sorted({e["category"] for e in bad}))
        lines.append(f"| `{fn}` | {defect} | {where} | {cats} |")
    if lines:
        print("\nrecorded regression files; README lines to complete:")
        print("\n".join(lines))


def fd_check(doc, ref64, rng, cells):
    """Compares the reference's gradients with central finite differences on up to ``cells``
    sampled param cells. Returns (checked, skipped, failures)."""
    base = {name: list(p["values"].v) for name, p in ref64["params"].items()}
    total = float(sum(abs(x) for x in ref64["values"].v if math.isfinite(x)))
    try:
        _, trace0 = reference.root_sum(doc, base)
    except (reference.DocError, reference.Unsupported):
        return 0, 0, []
    choices = [(name, j) for name, p in ref64["params"].items() for j in range(p["values"].v.size)
               if "grad" in p and not p["grad"].amb[j] and not p["values"].amb[j]]
    rng.shuffle(choices)
    checked, skipped, failures = 0, 0, []
    for name, j in choices[:cells]:
        x = base[name][j]
        h = FD_STEP * max(1.0, abs(x))
        vals = []
        ok = True
        for step in (h, -h, h / 2, -h / 2):
            pv = {k: list(v) for k, v in base.items()}
            pv[name][j] = x + step
            s, trace = reference.root_sum(doc, pv)
            if len(trace) != len(trace0) or any(
                    a.shape != b.shape or not (a == b).all() for a, b in zip(trace, trace0)):
                ok = False  # a comparison, branch or maximum changed: not differentiable here
                break
            vals.append(s)
        if not ok or not all(math.isfinite(v) for v in vals):
            skipped += 1
            continue
        d1 = (vals[0] - vals[1]) / (2 * h)
        d2 = (vals[2] - vals[3]) / h
        fd = (4 * d2 - d1) / 3
        g = float(ref64["params"][name]["grad"].v[j])
        checked += 1
        if not math.isfinite(g) or abs(fd - g) > FD_RTOL * max(abs(fd), abs(g)) + \
                FD_ATOL * (1 + total):
            failures.append(f"d/d {name}[{j}]: reference {g!r}, finite difference {fd!r}")
    return checked, skipped, failures


class Options:
    def __init__(self, a):
        self.binary = os.path.abspath(a.bin)
        self.backends = a.backends.split(",")
        self.precisions = a.precisions.split(",")
        self.fd_cells = a.fd_cells
        self.minimize = not a.no_minimize
        self.max_runs = a.minimize_runs
        self.save = a.save_dir
        self.cache = a.cache_dir
        self.avoid = frozenset(x for x in (a.avoid or "").split(",") if x)


def process(opts, label, doc, intended_shape, known):
    """Runs one document on every backend and precision. Returns a dict of outcomes."""
    env = compare.tool_env(opts.cache)
    out = {"label": label, "id": doc_id(doc), "runs": [], "self": [], "fd": (0, 0),
           "cells": [0, 0]}
    try:
        ref64 = reference.evaluate(doc, "f64")
        if intended_shape is not None and ref64["shape"] != intended_shape:
            out["self"].append(("generator-shape", f"reference {ref64['shape']} vs generator "
                                                   f"{intended_shape}"))
    except reference.DocError as e:
        out["self"].append(("reference-error", f"{e.kind}: {e.message}"))
        ref64 = None
    except reference.Unsupported as e:
        out["self"].append(("unsupported", str(e)))
        ref64 = None
    answers = {}
    for b in opts.backends:
        for p in opts.precisions:
            ans = compare.run_tool(opts.binary, doc, "eval", b, p, env)
            answers[(b, p)] = ans
            if ref64 is None:
                continue
            res = compare.compare(doc, ans, p)
            out["cells"][0] += res.compared
            out["cells"][1] += res.ambiguous
            entry = {"backend": b, "precision": p, "category": res.category,
                     "detail": res.detail}
            if res.category in TOOL_CATEGORIES:
                entry["known"] = known.get((out["id"], b, p, res.category))
            elif res.category != "ok":
                out["self"].append((res.category, res.detail))
            out["runs"].append(entry)
    # Inferred params: the shapes command must agree too.
    if ref64 is not None and compare.has_inferred_params(doc):
        ans = compare.run_tool(opts.binary, doc, "shapes", env=env)
        res = compare.compare(doc, ans, "f64", ref64)
        entry = {"backend": "shapes", "precision": "-", "category": res.category,
                 "detail": res.detail}
        if res.category in TOOL_CATEGORIES:
            entry["known"] = known.get((out["id"], "shapes", "-", res.category))
        elif res.category != "ok":
            out["self"].append((res.category, res.detail))
        out["runs"].append(entry)
    # The reference's gradients against finite differences (with the tool's random inits).
    if ref64 is not None and doc.get("grad") and opts.fd_cells > 0:
        ans64 = next((a for (b, p), a in answers.items() if p == "f64"), None) or \
            next(iter(answers.values()))
        r = compare.reference_result(doc, "f64", ans64)
        if not isinstance(r, compare.Comparison):
            checked, skipped, failures = fd_check(doc, r, random.Random(out["id"]),
                                                  opts.fd_cells)
            out["fd"] = (checked, skipped)
            for f in failures:
                out["self"].append(("reference-gradient", f))
    # Minimize the first new mismatch, then see where the small document fails.
    bad = [e for e in out["runs"] if e["category"] in TOOL_CATEGORIES and not e.get("known")]
    evals = [e for e in bad if e["backend"] != "shapes"]
    if evals and opts.minimize:
        e = evals[0]
        first = answers[(e["backend"], e["precision"])]
        m = minimize.Minimizer(opts.binary, e["backend"], e["precision"], e["category"], env,
                               opts.max_runs, first.error)
        small = m.run(doc, answers[(e["backend"], e["precision"])])
        where = []
        for b in opts.backends:
            for p in opts.precisions:
                ans = compare.run_tool(opts.binary, small, "eval", b, p, env)
                res = compare.compare(small, ans, p)
                where.append({"backend": b, "precision": p, "category": res.category,
                              "detail": res.detail})
        out["minimized"] = {"doc": small, "where": where, "tool_runs": m.runs}
    if bad and opts.save:
        os.makedirs(opts.save, exist_ok=True)
        e = bad[0]
        fn = os.path.join(opts.save, f"{e['category']}-{out['id']}.json")
        with open(fn, "w") as f:
            json.dump({"label": label, "id": out["id"], "mismatches": bad, "doc": doc,
                       "minimized": out.get("minimized")}, f, indent=1)
        out["saved"] = fn
    return out


def work(args):
    opts, label, seed, index, known = args
    t0 = time.time()
    if seed is not None:
        try:
            doc, shp, feats = generator.generate(f"{seed}/{index}", opts.avoid)
        except Exception as e:  # noqa: BLE001 - any generator failure is reported, not fatal
            return {"label": label, "id": "-", "runs": [], "self": [("generator-crash", repr(e))],
                    "fd": (0, 0), "cells": [0, 0], "features": Counter(), "time": 0.0}
    else:
        doc, shp, feats = index, None, Counter()
    out = process(opts, label, doc, shp, known)
    out["features"] = feats
    out["doc"] = doc
    out["time"] = time.time() - t0
    return out


def machine():
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "..", "target", "release", "rocannl"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--start", type=int, default=0, help="first document index")
    ap.add_argument("--backends", default="interp,gccjit")
    ap.add_argument("--precisions", default="f32,f64")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--fd-cells", type=int, default=4,
                    help="param cells per document checked by finite differences")
    ap.add_argument("--no-minimize", action="store_true")
    ap.add_argument("--minimize-runs", type=int, default=250)
    ap.add_argument("--save-dir", default=os.path.join(HERE, "failures"))
    ap.add_argument("--cache-dir", default=None,
                    help="ROCANNL_CACHE_DIR for the tool (default: a fresh temporary folder)")
    ap.add_argument("--avoid", default="",
                    help="comma-separated generator features to leave out: " +
                    "; ".join(f"{k} ({v})" for k, v in generator.AVOIDABLE.items()))
    ap.add_argument("--replay", nargs="*", help="documents (or saved failures) to run instead")
    ap.add_argument("--json-out", help="write the summary as JSON")
    ap.add_argument("--record", action="store_true",
                    help="write documents with new mismatches into regressions/ (for review)")
    ap.add_argument("--update-readme", action="store_true",
                    help="rewrite the tables of regressions/README.md from its files and exit")
    ap.add_argument("--quiet", action="store_true",
                    help="print neither whole documents nor each known mismatch")
    a = ap.parse_args()
    if a.update_readme:
        update_readme()
        return 0
    tmp = None
    if a.cache_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="difftest-cache-")
        a.cache_dir = tmp.name
    opts = Options(a)
    known = load_known()
    if a.replay is not None:
        tasks = []
        for fn in a.replay:
            d = json.load(open(fn))
            if "expr" not in d:  # a regression file or a saved failure
                d = (d.get("minimized") or {}).get("doc") or d["doc"]
            tasks.append((opts, os.path.basename(fn), None, d, known))
    else:
        tasks = [(opts, f"{a.seed}/{i}", a.seed, i, known)
                 for i in range(a.start, a.start + a.count)]
    t0 = time.time()
    results = []
    if a.jobs > 1:
        with concurrent.futures.ProcessPoolExecutor(a.jobs) as ex:
            results = list(ex.map(work, tasks, chunksize=4))
    else:
        results = [work(t) for t in tasks]
    elapsed = time.time() - t0
    summary = summarize(results, opts, elapsed, a, known)
    if a.record:
        record(results, opts)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(summary, f, indent=1)
    if tmp:
        tmp.cleanup()
    return 1 if summary["new"] or summary["self_defects"] else 0


def summarize(results, opts, elapsed, a, known):
    per = Counter()
    cats = Counter()
    features = Counter()
    self_defects = Counter()
    new, known_hits = [], []
    fd_checked = fd_skipped = cells = amb = 0
    for r in results:
        features.update(r["features"])
        fd_checked += r["fd"][0]
        fd_skipped += r["fd"][1]
        cells += r["cells"][0]
        amb += r["cells"][1]
        for cat, detail in r["self"]:
            self_defects[cat] += 1
            print(f"TEST DEFECT {r['label']} ({r['id']}) {cat}: {detail}")
            if not a.quiet:
                print("  document:", json.dumps(r.get("doc")))
        for e in r["runs"]:
            per[(e["backend"], e["precision"], e["category"])] += 1
            cats[e["category"]] += 1
            if e["category"] in TOOL_CATEGORIES:
                (known_hits if e.get("known") else new).append((r, e))
    for r, e in new:
        print(f"NEW MISMATCH {r['label']} ({r['id']}) {e['backend']} {e['precision']} "
              f"{e['category']}: {e['detail']}")
    shown = set()
    for r, e in new:
        if r["id"] in shown:
            continue
        shown.add(r["id"])
        m = r.get("minimized")
        if m:
            fails = [f"{w['backend']}/{w['precision']}:{w['category']}" for w in m["where"]
                     if w["category"] != "ok"]
            print(f"  minimized ({minimize.size(m['doc']['expr'])} nodes, fails on "
                  f"{', '.join(fails) or 'nothing'}):")
            print("  " + json.dumps(m["doc"]))
        elif not a.quiet:
            print("  document:", json.dumps(r.get("doc")))
        if r.get("saved"):
            print("  saved:", os.path.relpath(r["saved"]))
    for r, e in known_hits if not a.quiet else []:
        print(f"known {r['label']} ({r['id']}) {e['backend']} {e['precision']} {e['category']}: "
              f"regressions/{e['known']}")
    # Known mismatches of the documents run here that did not happen: a defect may be fixed.
    seen = {(r["id"], e["backend"], e["precision"], e["category"]) for r in results
            for e in r["runs"]}
    ran = {r["id"]: r["label"] for r in results}
    pairs = {(r["id"], e["backend"], e["precision"]) for r in results for e in r["runs"]}
    gone = sorted({(ran[k[0]], v) for k, v in known.items() if k[:3] in pairs and k not in seen})
    for label, fn in gone:
        print(f"no longer mismatching: {label} (regressions/{fn}): fixed? then remove that file")
    docs = len(results)
    runs = sum(cats.values())
    print()
    print(f"{docs} documents, {runs} tool runs in {elapsed:.1f} s on {machine()}")
    print(f"cells compared: {cells}, ambiguous (not compared): {amb}; finite-difference checks "
          f"of the reference: {fd_checked} cells, {fd_skipped} skipped at discontinuities")
    for b, p in [(b, p) for b in opts.backends for p in opts.precisions] + [("shapes", "-")]:
        row = {c: per[(b, p, c)] for c in ("ok",) + TOOL_CATEGORIES if per[(b, p, c)]}
        if row:
            print(f"  {b:7s} {p:3s}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    print(f"mismatches: {len(new)} new, {len(known_hits)} known; test defects: "
          f"{sum(self_defects.values())}")
    return {"documents": docs, "tool_runs": runs, "seconds": round(elapsed, 1),
            "machine": machine(), "cells_compared": cells, "cells_ambiguous": amb,
            "fd_checked": fd_checked, "fd_skipped": fd_skipped,
            "per_backend": {f"{b}/{p}/{c}": n for (b, p, c), n in sorted(per.items())},
            "categories": dict(cats), "new": len(new), "known": len(known_hits),
            "no_longer_mismatching": [fn for _, fn in gone],
            "self_defects": dict(self_defects),
            "new_mismatches": [{"label": r["label"], "id": r["id"], "backend": e["backend"],
                                "precision": e["precision"], "category": e["category"],
                                "detail": e["detail"],
                                "minimized": (r.get("minimized") or {}).get("doc")}
                               for r, e in new],
            "features": dict(features)}


if __name__ == "__main__":
    sys.exit(main())
