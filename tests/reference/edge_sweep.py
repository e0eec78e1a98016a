"""Edge-case sweep of ``rocannl eval`` against values and gradients computed by PyTorch.

Why this file exists: the random differential test (``difftest.py``) draws finite, moderate
inputs; the places where implementations part ways are the IEEE corners: signed zeros,
infinities, NaN, overflow and subnormals, masked (-inf) logits, boundary probabilities. This
script evaluates every pointwise operation of the document contract, the reductions (``einsum1``
sum, ``einmax1`` max) and a softmax / log-softmax written as operations at such inputs, with
their gradients, and compares rocannl's answers with PyTorch's.

Two modes:

- ``--generate`` (needs ``torch``): builds the documents, evaluates them with PyTorch in float32
  and float64 and writes ``edge_sweep_expected.json`` (documents, expected values and gradients,
  the torch version). Run it after changing the cases; the file is committed.
- default (CI; needs neither torch nor numpy): runs ``rocannl eval`` on every document of the
  expected file for each backend and precision, compares, prints a table of the differences and
  exits 1 on any difference not listed in ``edge_sweep_known.json`` (each entry with its reason).

Comparison of one cell:

- NaN must be NaN; an infinity must be the same infinity;
- finite values pass when ``|got - want| <= RTOL·max(|got|, |want|) + ATOL`` (``RTOL`` per
  precision, ``ATOL`` a few of the precision's smallest subnormals); for reductions the absolute
  part also includes ``RTOL`` times the largest finite expected magnitude of the list (a sum
  cancels);
- the sign of a zero is compared only in the values of pointwise operations, where IEEE fixes it
  (``neg``, ``pointmul``, ``div`` by a signed zero, ``sqrt(-0)``, ...). It is not compared in
  gradients (rocannl accumulates every gradient into a buffer initialised to +0, so
  ``+0 + -0 = +0`` where PyTorch hands the single term through) nor in reductions (a sum starts
  from +0).

    python3 tests/reference/edge_sweep.py --bin target/debug/rocannl
    /path/to/torch/venv/bin/python tests/reference/edge_sweep.py --generate
"""

import argparse
import concurrent.futures
import json
import math
import os
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
EXPECTED = os.path.join(HERE, "edge_sweep_expected.json")
KNOWN = os.path.join(HERE, "edge_sweep_known.json")

# Relative tolerance per precision: a few dozen ulps, for library functions (sin of a huge
# argument, pow) that two correct implementations may round differently.
RTOL = {"f32": 2.0**-24 * 64, "f64": 2.0**-53 * 64}
ATOL = {"f32": 4 * 2.0**-149, "f64": 4 * 2.0**-1074}

INF, NAN = math.inf, math.nan


def edge_values(precision):
    """The inputs of the pointwise sweeps: every corner, plus a few ordinary numbers (2 and -2.5
    for powers of negative bases, 0.5 between 0 and 1)."""
    if precision == "f32":
        huge, tiny, small = 3e38, 1e-45, 1e-38
    else:
        huge, tiny, small = 1e308, 5e-324, 1e-300
    return [0.0, -0.0, INF, -INF, NAN, huge, -huge, tiny, -tiny, small, -small,
            1.0, -1.0, 0.5, 2.0, -2.5]


def jnum(x):
    """A number as the document format writes it."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def fnum(x):
    if isinstance(x, str):
        return {"inf": INF, "-inf": -INF, "nan": NAN}[x]
    return float(x)


def label(x):
    if math.isnan(x):
        return "nan"
    if x == 0:
        return "-0" if math.copysign(1, x) < 0 else "0"
    return repr(x)


def param(name, values=None, output=None, batch=None):
    """A param leaf with explicit values (non-finite values as strings); without values, a later
    occurrence of the param."""
    if values is None:
        return {"leaf": "param", "name": name}
    p = {"leaf": "param", "name": name, "output": output or [len(values)], "input": [],
         "init": {"values": [jnum(v) for v in values]}}
    if batch:
        p["batch"] = batch
    return p


def ndarray(values, output=None, batch=None):
    a = {"leaf": "ndarray", "values": [jnum(v) for v in values],
         "output": output or [len(values)]}
    if batch:
        a["batch"] = batch
    return a


def op(name, *args, **kw):
    e = {"op": name, "args": list(args)}
    e.update(kw)
    return e


UNARY = ["neg", "relu", "exp", "log", "sqrt", "tanh", "sigmoid", "sin", "cos", "recip", "abs",
         "not"]
BINARY = ["add", "sub", "pointmul", "div", "pow", "max", "min", "lt", "eq", "ne"]
NOT_DIFFERENTIABLE = {"not", "lt", "eq", "ne"}
ROW = "b|i => b|"  # einsum1 / einmax1 over the output axis of each batch row


def reduction_rows(precision):
    huge = 3e38 if precision == "f32" else 1e308
    tiny = 1e-45 if precision == "f32" else 5e-324
    return [
        ([1.0, 2.0, 3.0, 4.0], "ordinary"),
        ([-INF, 1.0, 2.0, 3.0], "one -inf (masked)"),
        ([-INF, -INF, -INF, -INF], "all -inf (masked)"),
        ([INF, 1.0, 2.0, 3.0], "one +inf"),
        ([NAN, 1.0, 2.0, 3.0], "one nan"),
        ([huge, -huge, 0.0, 1.0], "huge of both signs"),
        ([huge, huge, 1.0, 2.0], "huge (tied), sum overflows"),
        ([0.0, -0.0, tiny, -tiny], "zeros and subnormals"),
        ([-1.0, -2.0, -3.0, -1e4], "large negative spread"),
    ]


def cases(precision):
    """Every case: (id, document, inputs, kind) with kind "pointwise" or "reduction"; inputs
    describe each result cell, or are a pair (per result cell, per param cell)."""
    vals = edge_values(precision)
    out = []
    for name in UNARY:
        doc = {"expr": op(name, param("x", vals)), "grad": name not in NOT_DIFFERENTIABLE}
        out.append((f"{name}", doc, [f"x={label(v)}" for v in vals], "pointwise"))
    xs = [a for a in vals for _ in vals]
    ys = [b for _ in vals for b in vals]
    for name in BINARY:
        doc = {"expr": op(name, param("x", xs), param("y", ys)),
               "grad": name not in NOT_DIFFERENTIABLE}
        out.append((f"{name}", doc, [f"x={label(a)}, y={label(b)}" for a, b in zip(xs, ys)],
                    "pointwise"))
    # where: the condition (a constant) takes NaN, ±0 and 1; both branches every edge value.
    conds = [1.0, 0.0, -0.0, NAN]
    cs = [c for c in conds for _ in vals]
    a = [v for _ in conds for v in vals]
    b = [v for _ in conds for v in reversed(vals)]
    doc = {"expr": op("where", ndarray(cs), param("a", a), param("b", b)), "grad": True}
    out.append(("where", doc, [f"c={label(c)}, a={label(x)}, b={label(y)}"
                               for c, x, y in zip(cs, a, b)], "pointwise"))
    # An untaken branch that is NaN or infinite, and its gradient: where(x > 0, sqrt(x), 0) and
    # where(x < 80, x, exp(x)) (PyTorch: the untaken branch's gradient is 0 times its local
    # derivative, so NaN where that derivative is NaN or infinite).
    doc = {"expr": op("where", op("lt", {"leaf": "number", "value": 0}, param("x", vals)),
                      op("sqrt", param("x")), {"leaf": "number", "value": 0}), "grad": True}
    out.append(("where-sqrt-untaken", doc, [f"x={label(v)}" for v in vals], "pointwise"))
    big = [1000.0, 100.0, 1.0, -1000.0, NAN, INF, -INF, 0.0]
    doc = {"expr": op("where", op("lt", param("x", big), {"leaf": "number", "value": 80}),
                      param("x"), op("exp", param("x"))), "grad": True}
    out.append(("where-exp-untaken", doc, [f"x={label(v)}" for v in big], "pointwise"))
    # Powers at the boundary with a constant exponent: x**0, x**1, x**2, x**0.5, x**-1.
    for e in (0.0, 1.0, 2.0, 0.5, -1.0, 3.0):
        doc = {"expr": op("pow", param("x", vals), {"leaf": "number", "value": e}), "grad": True}
        out.append((f"pow-exp{e:g}", doc, [f"x={label(v)}" for v in vals], "pointwise"))
    # Reductions over rows, and a softmax / log-softmax written as operations, weighted by a
    # constant so that the gradient of the sum is not identically zero.
    rows = reduction_rows(precision)
    flat = [v for r, _ in rows for v in r]
    r_n, c_n = len(rows), len(rows[0][0])
    row_labels = [d for _, d in rows]
    xrow = lambda: param("x", flat, output=[c_n], batch=[r_n])  # noqa: E731
    cell_labels = [f"{d}, cell {j}" for _, d in rows for j in range(c_n)]
    out.append(("einsum1-sum", {"expr": op("einsum1", xrow(), spec=ROW), "grad": True},
                (row_labels, cell_labels), "reduction"))
    out.append(("einmax1-max", {"expr": op("einmax1", xrow(), spec=ROW), "grad": True},
                (row_labels, cell_labels), "reduction"))
    w = ndarray([1.0, 2.0, 3.0, 4.0])
    shifted = lambda: op("sub", xrow(), op("einmax1", param("x"), spec=ROW))  # noqa: E731
    x2 = {"ref": "shifted"}
    sm = op("pointmul",
            op("div", op("exp", dict(shifted(), name="shifted")),
               op("einsum1", op("exp", x2), spec=ROW)), w)
    out.append(("softmax", {"expr": sm, "grad": True}, cell_labels, "reduction"))
    lsm = op("pointmul",
             op("sub", dict(shifted(), name="shifted"),
                op("log", op("einsum1", op("exp", x2), spec=ROW))), w)
    out.append(("log-softmax", {"expr": lsm, "grad": True}, cell_labels, "reduction"))
    return out


# ---------------------------------------------------------------------------------------------
# PyTorch evaluation (--generate)

def torch_eval(doc, dtype):
    """The root's values and every param's gradient, by PyTorch, for the documents built above."""
    import torch

    params, nodes = {}, {}

    def leaf_tensor(e):
        shape = list(e.get("batch", [])) + list(e.get("output", [])) + list(e.get("input", []))
        vals = [fnum(v) for v in e["values"]] if "values" in e else \
            [fnum(v) for v in e["init"]["values"]]
        return torch.tensor(vals, dtype=dtype).reshape(shape)

    un = {
        "neg": torch.neg, "relu": torch.relu, "exp": torch.exp, "log": torch.log,
        "sqrt": torch.sqrt, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "sin": torch.sin,
        "cos": torch.cos, "recip": torch.reciprocal, "abs": torch.abs,
        "not": lambda x: (x == 0).to(dtype),
    }
    bi = {
        "add": torch.add, "sub": torch.sub, "pointmul": torch.mul, "div": torch.div,
        "pow": torch.pow, "max": torch.maximum, "min": torch.minimum,
        "lt": lambda a, b: (a < b).to(dtype), "eq": lambda a, b: (a == b).to(dtype),
        "ne": lambda a, b: (a != b).to(dtype),
    }

    def ev(e):
        if "ref" in e:
            return nodes[e["ref"]]
        if e.get("leaf") == "param":
            if e["name"] not in params:
                t = leaf_tensor(e)
                t.requires_grad_(True)
                params[e["name"]] = t
            return params[e["name"]]
        if e.get("leaf") == "ndarray":
            return leaf_tensor(e)
        if e.get("leaf") == "number":
            return torch.tensor(float(e["value"]), dtype=dtype)
        args = [ev(a) for a in e["args"]]
        o = e["op"]
        if o in un:
            r = un[o](*args)
        elif o in bi:
            a, b = args
            r = bi[o](a, b)
        elif o == "where":
            r = torch.where(args[0] != 0, args[1], args[2])
        elif o in ("einsum1", "einmax1"):
            assert e["spec"] == ROW
            # The reduced axis is kept (size 1) so that it broadcasts against the argument's
            # rows as rocannl's empty output row does; flattened, the values are the same.
            r = args[0].sum(dim=-1, keepdim=True) if o == "einsum1" else \
                args[0].amax(dim=-1, keepdim=True)
        else:
            raise ValueError(o)
        if "name" in e:
            nodes[e["name"]] = r
        return r

    root = ev(doc["expr"])
    grads = {}
    if doc.get("grad") and root.requires_grad:
        root.backward(torch.ones_like(root))
        for name, p in params.items():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grads[name] = [jnum(float(v)) for v in g.detach().reshape(-1).tolist()]
    return [jnum(float(v)) for v in root.detach().reshape(-1).tolist()], grads


def generate():
    import torch

    torch.set_num_threads(1)
    out = {"torch": torch.__version__, "precisions": {}}
    for prec, dtype in (("f32", torch.float32), ("f64", torch.float64)):
        lst = []
        for cid, doc, inputs, kind in cases(prec):
            values, grads = torch_eval(doc, dtype)
            value_inputs, param_inputs = inputs if isinstance(inputs, tuple) else (inputs, inputs)
            lst.append({"id": cid, "kind": kind, "doc": doc, "inputs": value_inputs,
                        "param_inputs": param_inputs, "values": values, "grads": grads})
        out["precisions"][prec] = lst
    with open(EXPECTED, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {EXPECTED} (torch {torch.__version__})")


# ---------------------------------------------------------------------------------------------
# Comparison (default mode)

def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0] if math.isfinite(x) else x


def cell_diff(got, want, precision, zero_sign, scale):
    """None when the cell agrees, else a short reason."""
    if not isinstance(got, (int, float, str)) or isinstance(got, bool):
        return "not a number"
    g, w = fnum(got), fnum(want)
    if precision == "f32":
        g = f32(g)
    if math.isnan(w) or math.isnan(g):
        return None if math.isnan(w) and math.isnan(g) else "nan"
    if math.isinf(w) or math.isinf(g):
        return None if g == w else "inf"
    if g == w:
        if zero_sign and g == 0 and math.copysign(1, g) != math.copysign(1, w):
            return "zero sign"
        return None
    tol = RTOL[precision] * (max(abs(g), abs(w)) + scale) + ATOL[precision]
    return None if abs(g - w) <= tol else "tolerance"


def compare_case(case, answer, precision):
    """Every differing cell: (what, cell, got, want, why)."""
    if answer.obj is None or answer.error or answer.rc != 0:
        err = answer.error or {"message": answer.stderr.strip()[-200:]}
        return [("run", -1, err.get("message", ""), "", "error")]
    diffs = []
    lists = [("values", answer.obj.get("values"), case["values"], case["kind"] == "pointwise")]
    for name, g in case["grads"].items():
        got = answer.obj.get("params", {}).get(name, {}).get("grad")
        lists.append((f"grad {name}", got, g, False))
    for what, got, want, zero_sign in lists:
        if not isinstance(got, list) or len(got) != len(want):
            diffs.append((what, -1, str(got)[:40], f"{len(want)} cells", "missing"))
            continue
        scale = 0.0
        if case["kind"] == "reduction":
            fin = [abs(fnum(v)) for v in want if math.isfinite(fnum(v))]
            scale = max(fin, default=0.0)
        for j, (g, w) in enumerate(zip(got, want)):
            why = cell_diff(g, w, precision, zero_sign, scale)
            if why:
                diffs.append((what, j, g, w, why))
    return diffs


def load_known():
    if not os.path.exists(KNOWN):
        return []
    entries = json.load(open(KNOWN))["known"]
    for e in entries:
        if not e.get("reason"):
            raise SystemExit(f"{KNOWN}: an entry without a reason: {e}")
    return entries


def known_reason(entries, cid, what, inputs, backend, precision):
    for e in entries:
        if e["case"] != cid or e.get("what", what) != what:
            continue
        if backend not in e.get("backends", [backend]):
            continue
        if precision not in e.get("precisions", [precision]):
            continue
        if "inputs" in e and inputs not in e["inputs"]:
            continue
        if "inputs_containing" in e and not any(t in inputs for t in e["inputs_containing"]):
            continue
        e["_used"] = True
        return e["reason"]
    return None


def run(opts):
    import compare  # run_tool: one ``rocannl`` invocation (compare.py needs numpy)

    data = json.load(open(EXPECTED))
    known = load_known()
    jobs = []
    for b in opts.backends:
        for p in opts.precisions:
            for case in data["precisions"][p]:
                jobs.append((b, p, case))
    cache = tempfile.mkdtemp(prefix="rocannl-edge-sweep-") if opts.fresh_cache else None
    env = compare.tool_env(cache)
    t0 = time.time()

    def one(job):
        b, p, case = job
        ans = compare.run_tool(opts.binary, case["doc"], "eval", b, p, env)
        return job, compare_case(case, ans, p)

    with concurrent.futures.ThreadPoolExecutor(max_workers=opts.jobs) as pool:
        results = list(pool.map(one, jobs))
    new, allowed = [], []
    for (b, p, case), diffs in results:
        for what, j, got, want, why in diffs:
            labels = case["inputs"] if what == "values" else case["param_inputs"]
            inputs = labels[j] if 0 <= j < len(labels) else "-"
            reason = known_reason(known, case["id"], what, inputs, b, p)
            row = (case["id"], f"{b}/{p}", what, inputs, str(got), str(want), why)
            (allowed if reason else new).append(row)
    rows = [("case", "run", "what", "inputs", "rocannl", "torch", "why")]
    if opts.verbose:
        rows += [r + ("",) for r in allowed]
    rows += new
    if len(rows) > 1:
        widths = [min(40, max(len(r[i]) for r in rows)) for i in range(7)]
        for r in rows:
            print("  ".join(str(c)[:40].ljust(w) for c, w in zip(r, widths)).rstrip())
    cells = sum(len(c["values"]) + sum(len(g) for g in c["grads"].values())
                for _, _, c in jobs)
    print(f"edge sweep: {len(jobs)} runs, {cells} cells compared against torch "
          f"{data['torch']}; {len(allowed)} known differences (edge_sweep_known.json), "
          f"{len(new)} new; {time.time() - t0:.1f}s")
    for e in known:
        if not e.get("_used"):
            print(f"note: a known difference that no longer occurs (edge_sweep_known.json): "
                  f"case {e['case']}, {e.get('what', 'any list')}")
    return 1 if new else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generate", action="store_true",
                    help="compute the expected values with PyTorch and write the expected file")
    ap.add_argument("--bin", default="target/debug/rocannl")
    ap.add_argument("--backends", default="interp,gccjit")
    ap.add_argument("--precisions", default="f32,f64")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--fresh-cache", action="store_true",
                    help="run with an empty compile cache in a temporary directory")
    ap.add_argument("-v", "--verbose", action="store_true", help="also list known differences")
    a = ap.parse_args()
    if a.generate:
        generate()
        return 0
    a.binary = os.path.abspath(a.bin)
    a.backends = a.backends.split(",")
    a.precisions = a.precisions.split(",")
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
