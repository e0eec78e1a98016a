"""Runs ``rocannl`` on one document and compares its answer with the reference evaluator.

Why this file exists: the driver (``difftest.py``), the minimizer and the regression runner all
need the same two steps — run the binary for one backend and precision, then classify how its
answer differs from the reference. Keeping them here gives every caller the same categories and
the same tolerance rule.

Categories of an outcome:

- ``ok``: shapes equal, every compared cell within tolerance;
- ``rejected``: the tool answered an error for a document the reference evaluates (the generator
  believes it valid);
- ``reference-error``: the reference rejects the document (a generator or reference defect);
- ``unsupported``: beyond the reference's shape inference (a generator defect);
- ``crash``: no JSON object, a panic, a timeout;
- ``shape``: a shape of the root, a named node or a param differs;
- ``value``: a value of the root, a named node or a param differs;
- ``grad``: a param gradient differs.

Tolerance, per cell: the reference bounds the error of a correct evaluation in the requested
precision by ``e`` units of roundoff ``u`` (2^-24 for f32, 2^-53 for f64; see ``reference.py``);
the tool's cell passes when ``|tool - ref| <= SAFETY * e * u``. A cell computed exactly has
``e = 0`` and must match exactly. Non-finite cells must be the same non-finite value. Cells the
reference marks ambiguous are not compared (they are counted).
"""

import json
import math
import os
import subprocess

import numpy as np

import reference

TIMEOUT_S = 60


class ToolAnswer:
    def __init__(self, rc, obj, text, stderr, command="eval"):
        self.rc, self.obj, self.text, self.stderr = rc, obj, text, stderr
        self.command = command

    @property
    def error(self):
        return self.obj.get("error") if isinstance(self.obj, dict) else None


def run_tool(binary, doc, command="eval", backend=None, precision=None, env=None):
    args = [binary, command, "-"]
    if backend:
        args += ["--backend", backend]
    if precision:
        args += ["--precision", precision]
    try:
        p = subprocess.run(args, input=json.dumps(doc), capture_output=True, text=True,
                           timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return ToolAnswer(None, None, "", f"timed out after {TIMEOUT_S}s", command)
    try:
        obj = json.loads(p.stdout)
    except ValueError:
        obj = None
    return ToolAnswer(p.returncode, obj, p.stdout, p.stderr, command)


def tool_number(x, precision):
    if isinstance(x, str):
        return {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}.get(x)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(np.float32(x)) if precision == "f32" else float(x)


class Comparison:
    """The outcome of comparing one tool answer with the reference."""

    def __init__(self, category, detail="", compared=0, ambiguous=0):
        self.category, self.detail = category, detail
        self.compared, self.ambiguous = compared, ambiguous

    def __repr__(self):
        return f"{self.category}: {self.detail}" if self.detail else self.category


def compare_cells(what, ref, got, precision, stats):
    """Returns a description of the first mismatching cell, or None."""
    if not isinstance(got, list):
        return f"{what}: missing"
    if len(got) != ref.v.size:
        return f"{what}: {len(got)} cells, reference has {ref.v.size}"
    u = reference.UNIT_ROUNDOFF[precision]
    bad = []
    for j, (g, rv, re_, ra) in enumerate(zip(got, ref.v, ref.e, ref.amb)):
        if ra:
            stats["ambiguous"] += 1
            continue
        stats["compared"] += 1
        t = tool_number(g, precision)
        if t is None:
            bad.append((j, g, rv, "not a number"))
        elif not math.isfinite(rv):
            same = math.isnan(t) if math.isnan(rv) else t == rv
            if not same:
                bad.append((j, g, rv, "non-finite"))
        elif not math.isfinite(t) or abs(t - rv) > reference.SAFETY * re_ * u:
            bad.append((j, g, rv, f"tolerance {reference.SAFETY * re_ * u:.3g}"))
    if not bad:
        return None
    j, g, rv, why = bad[0]
    return (f"{what}: cell {j} is {g}, reference {float(rv)!r} ({why}; {len(bad)} of {len(got)} "
            "cells)")


def uniform_values(doc, answer):
    """Values of params with a uniform init, taken from the tool's answer."""
    names = set()

    def walk(e):
        if isinstance(e, dict):
            init = e.get("init")
            if e.get("leaf") == "param" and isinstance(init, dict) and "uniform" in init:
                names.add(e.get("name"))
            for a in e.get("args", []) or []:
                walk(a)

    walk(doc.get("expr"))
    params = (answer.obj or {}).get("params", {}) if answer else {}
    return {n: params[n]["values"] for n in names if n in params and "values" in params[n]}


def reference_result(doc, precision, answer=None):
    """The reference's result, or a Comparison saying why there is none."""
    pv = uniform_values(doc, answer)
    try:
        return reference.evaluate(doc, precision,
                                  {k: [tool_number(x, "f64") for x in v] for k, v in pv.items()})
    except reference.DocError as e:
        return Comparison("reference-error", f"{e.kind}: {e.message}")
    except reference.Unsupported as e:
        return Comparison("unsupported", str(e))


def shape_problem(obj, ref):
    """The first shape of the root, a named node or a param that differs, or None."""
    if obj.get("shape") != ref["shape"]:
        return f"root {obj.get('shape')} != reference {ref['shape']}"
    for name, n in ref["nodes"].items():
        got = obj.get("nodes", {}).get(name, {}).get("shape")
        if got != n["shape"]:
            return f"node {name}: {got} != reference {n['shape']}"
    for name, p in ref["params"].items():
        got = obj.get("params", {}).get(name, {}).get("shape")
        if got != p["shape"]:
            return f"param {name}: {got} != reference {p['shape']}"
    return None


def has_inferred_params(doc):
    """Whether some param's first occurrence leaves its input or output row to inference."""
    seen = set()

    def walk(e):
        if not isinstance(e, dict):
            return False
        if e.get("leaf") == "param" and e.get("name") not in seen:
            seen.add(e.get("name"))
            if "input" not in e or "output" not in e:
                return True
        return any(walk(a) for a in e.get("args", []) or [])

    return walk(doc.get("expr"))


def compare(doc, answer, precision, ref=None):
    """Classifies a tool answer against the reference (computed here unless given)."""
    if answer.obj is None or not isinstance(answer.obj, dict) or answer.rc not in (0, 1) \
            or "panicked" in answer.stderr:
        return Comparison("crash", f"exit {answer.rc}: {answer.stderr.strip()[-300:]}")
    if ref is None:
        ref = reference_result(doc, precision, answer)
    if isinstance(ref, Comparison):
        return ref
    if answer.error:
        return Comparison("rejected", f"{answer.error.get('kind')}: {answer.error.get('message')}")
    obj = answer.obj
    msg = shape_problem(obj, ref)
    if msg:
        return Comparison("shape", msg)
    if answer.command == "shapes":
        return Comparison("ok")
    stats = {"compared": 0, "ambiguous": 0}
    problems = []
    msg = compare_cells("values", ref["values"], obj.get("values"), precision, stats)
    if msg:
        problems.append(("value", msg))
    for name, n in ref["nodes"].items():
        msg = compare_cells(f"node {name}", n["values"], obj["nodes"][name].get("values"),
                            precision, stats)
        if msg:
            problems.append(("value", msg))
    for name, p in ref["params"].items():
        got = obj["params"][name]
        msg = compare_cells(f"param {name}", p["values"], got.get("values"), precision, stats)
        if msg:
            problems.append(("value", msg))
        if "grad" in p:
            msg = compare_cells(f"grad {name}", p["grad"], got.get("grad"), precision, stats)
            if msg:
                problems.append(("grad", msg))
    if problems:
        # Values first: a wrong value usually explains the wrong gradients below it.
        problems.sort(key=lambda p: p[0] != "value")
        return Comparison(problems[0][0], "; ".join(m for _, m in problems),
                          stats["compared"], stats["ambiguous"])
    return Comparison("ok", "", stats["compared"], stats["ambiguous"])


def tool_env(cache_dir=None):
    env = dict(os.environ)
    if cache_dir:
        env["ROCANNL_CACHE_DIR"] = cache_dir
    return env
