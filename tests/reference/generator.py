"""A seeded generator of random valid rocannl documents.

Why this file exists: hand-written cases cover what their authors thought of; the differential
test needs documents nobody thought of, in large numbers, that are valid by construction so that
any disagreement is a finding. Generation is top-down: every subexpression is asked for with the
exact shape its parent needs, so the parent's broadcasting, contraction or concatenation is valid
by construction, and the spec of every einsum-family operation is built from the shape it must
produce. Alongside the shape the generator tracks an interval for every subexpression, to keep the
arguments of ``log``, ``sqrt``, ``div``, ``pow`` and ``exp`` in safe ranges (wrapping a
subexpression in ``tanh``, ``exp`` or a power-of-two scale where its interval says so).

It covers every leaf and operation, the einsum notation's row variables (``...`` and
``..name..``), fixed indices on both sides, diagonals, convolution axes (strided, dilated, with
kernels of size 1), pure strides, concatenation (also ``a^a`` and parts out of argument order),
broadcasting of einsum arguments, params whose rows are inferred where the contract determines them
unambiguously, named nodes and ``ref``s, shared params, ``"grad": true``, exact ties, and ``where``
masks from one-hot ``ndarray`` conditions.

Shapes are small: at most 6 per axis (convolution inputs up to 12), at most 4 axes per tensor.

    python3 tests/reference/generator.py SEED [COUNT]   # prints documents, one per line
"""

import json
import math
import random
import sys
from collections import Counter

ROWS = ("batch", "input", "output")
MAX_AXES = 4
MAX_ITER = 20000

# Values that make ties likely and keep arithmetic exact.
DYADIC = [-2.0, -1.5, -1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0]
POS_DYADIC = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0]
MULTI_NAMES = ["ab", "cd", "h", "w", "k", "row", "col", "x", "y", "ch", "t", "u", "pq", "z",
               "m", "n", "s", "v", "rr", "gg"]

# Value domains a parent can ask of a subexpression: the interval its cells must lie in.
NEEDS = {
    "any": (-1e4, 1e4),
    "small": (-4.0, 4.0),
    "pos": (0.01, 100.0),
    "exact": (-64.0, 64.0),  # also: built from exact operations on dyadic values only
    "inf_ok": (-math.inf, 1e4),  # may hold -inf (cells a max does not write)
}


def shape(batch=(), input=(), output=()):
    return {"batch": list(batch), "input": list(input), "output": list(output)}


def naxes(s):
    return sum(len(s[r]) for r in ROWS)


def ncells(s):
    return math.prod(s["batch"] + s["input"] + s["output"])


def mem(s):
    return s["batch"] + s["output"] + s["input"]


class Ex:
    """A generated subexpression: its JSON, shape, value interval and properties."""

    def __init__(self, js, shp, lo, hi, exact=False, inferred=False):
        self.js, self.shape, self.lo, self.hi = js, shp, lo, hi
        self.exact = exact  # built from exact operations on dyadic leaves
        self.inferred = inferred  # holds a param whose rows depend on this node's context


def fits(ex, need):
    lo, hi = NEEDS[need]
    if need == "exact" and not ex.exact:
        return False
    return lo <= ex.lo and ex.hi <= hi and not (math.isinf(ex.lo) and need != "inf_ok")


def mul_iv(a, b):
    ps = [x * y for x in (a[0], a[1]) for y in (b[0], b[1])]
    ps = [0.0 if math.isnan(p) else p for p in ps]
    return min(ps), max(ps)


# Features that can be left out (``--avoid``), to look past defects already known.
AVOIDABLE = {
    "root-leaf": "a document whose whole expression is one leaf",
    "concat-repeat": "a concatenation repeating a label (a^a)",
    "slice-multi-batch": "batch_slice of a computed tensor with two or more batch axes",
}


class Generator:
    def __init__(self, seed, avoid=frozenset()):
        self.rng = random.Random(seed)
        self.seed = seed
        self.avoid = avoid
        self.features = Counter()
        self.pool = []  # completed named nodes: (name, Ex)
        self.params = {}  # reusable params: name -> Ex
        self.n_names = 0
        self.n_params = 0
        self.budget = 0

    # ------------------------------------------------------------------------------------------
    # Documents

    def document(self):
        r = self.rng
        self.budget = r.choice([2, 3, 4, 5, 6, 8, 10, 12, 16])
        root_shape = self.random_shape(max_axes=r.choice([0, 1, 2, 2, 3, 3, 4]))
        need = r.choice(["any", "any", "small", "exact", "inf_ok"])
        ex = self.gen(root_shape, need, rigid_ok=True, depth=0)
        grad = r.random() < 0.75
        if grad:
            self.features["grad"] += 1
        return {"expr": ex.js, "grad": grad}, ex.shape

    def random_shape(self, max_axes):
        r = self.rng
        n = r.randint(0, max_axes)
        rows = {k: [] for k in ROWS}
        for _ in range(n):
            rows[r.choice(["batch", "input", "output", "output"])].append(self.size())
        return shape(rows["batch"], rows["input"], rows["output"])

    def size(self, lo=1, hi=6):
        return self.rng.choice([x for x in [1, 2, 2, 3, 3, 4, 5, 6] if lo <= x <= hi] or [lo])

    def fresh_name(self, prefix):
        self.n_names += 1
        return f"{prefix}{self.n_names}"

    # ------------------------------------------------------------------------------------------
    # Subexpressions of a given shape

    def gen(self, shp, need, rigid_ok, depth):
        """A subexpression of exactly shape ``shp`` whose values satisfy ``need``. ``rigid_ok``:
        the parent will not broadcast it, so a param inferred from its context may appear."""
        r = self.rng
        ref = self.try_ref(shp, need, rigid_ok)
        if ref is not None:
            return ref
        leaf_p = 0.12 if depth > 0 else (0.0 if "root-leaf" in self.avoid else 0.02)
        if self.budget <= 0 or depth > 7 or r.random() < leaf_p:
            ex = self.leaf(shp, need)
        else:
            self.budget -= 1
            ex = self.op(shp, need, rigid_ok, depth)
        ex = self.condition(ex, need)
        if "name" not in ex.js and "ref" not in ex.js and ex.js.get("leaf") != "param" \
                and r.random() < 0.2:
            name = self.fresh_name("n")
            ex.js["name"] = name
            self.pool.append((name, ex))
            self.features["named node"] += 1
        return ex

    def try_ref(self, shp, need, rigid_ok):
        if self.rng.random() > 0.25:
            return None
        ok = [(n, e) for n, e in self.pool if e.shape == shp and fits(e, need)
              and (rigid_ok or not e.inferred)]
        if not ok:
            return None
        name, e = self.rng.choice(ok)
        self.features["ref"] += 1
        return Ex({"ref": name}, shp, e.lo, e.hi, e.exact, e.inferred)

    def condition(self, ex, need):
        """Wraps ``ex`` so that its interval satisfies ``need``."""
        if fits(ex, need):
            return ex
        r = self.rng
        if math.isinf(ex.lo) and need != "inf_ok":
            # Cells a max did not write: relu or max with a number make them finite.
            if r.random() < 0.5:
                self.features["relu of -inf"] += 1
                ex = Ex({"op": "relu", "args": [ex.js]}, ex.shape, 0.0, max(ex.hi, 0.0),
                        ex.exact, ex.inferred)
            else:
                c = r.choice([-1.0, 0.0, 0.5])
                self.features["max with -inf"] += 1
                ex = Ex({"op": "max", "args": [ex.js, {"leaf": "number", "value": c}]},
                        ex.shape, max(c, ex.lo), max(c, ex.hi), ex.exact, ex.inferred)
            if fits(ex, need):
                return ex
        lim = NEEDS["small" if need == "pos" else need][1]
        m = max(abs(ex.lo), abs(ex.hi))
        scalable = math.isfinite(m) and m < 2.0**20
        if scalable and (need in ("exact", "any", "inf_ok") or (ex.exact and r.random() < 0.5)):
            k = 0
            while m * 2.0**-k > lim:
                k += 1
            c = 2.0**-k
            self.features["scale by power of two"] += 1
            ex = Ex({"op": "pointmul", "args": [ex.js, {"leaf": "number", "value": c}]},
                    ex.shape, min(ex.lo * c, ex.hi * c), max(ex.lo * c, ex.hi * c), ex.exact,
                    ex.inferred)
            if fits(ex, need) or need == "exact":
                return ex
        if need != "pos":
            f = r.choice(["tanh", "sin", "cos", "sigmoid"])
            self.features[f] += 1
            lo, hi = (-1.0, 1.0) if f != "sigmoid" else (0.0, 1.0)
            if f == "tanh":
                lo, hi = math.tanh(ex.lo), math.tanh(ex.hi)
            return Ex({"op": f, "args": [ex.js]}, ex.shape, lo, hi, False, ex.inferred)
        # pos: exp of something small, or |small| + 1/2
        small = self.condition(ex, "small")
        if r.random() < 0.6:
            self.features["exp"] += 1
            return Ex({"op": "exp", "args": [small.js]}, ex.shape, math.exp(small.lo),
                      math.exp(small.hi), False, ex.inferred)
        self.features["abs"] += 1
        a = {"op": "abs", "args": [small.js]}
        hi = max(abs(small.lo), abs(small.hi)) + 0.5
        return Ex({"op": "add", "args": [a, {"leaf": "number", "value": 0.5}]}, ex.shape, 0.5, hi,
                  False, ex.inferred)

    # ------------------------------------------------------------------------------------------
    # Leaves

    def values(self, n, need):
        r = self.rng
        if need == "pos":
            if r.random() < 0.5:
                return [r.choice(POS_DYADIC) for _ in range(n)], True
            return [round(r.uniform(0.1, 3.0), 3) for _ in range(n)], False
        if need == "exact" or r.random() < 0.4:
            pool = DYADIC if r.random() < 0.7 else [-1.0, 0.0, 1.0]
            return [r.choice(pool) for _ in range(n)], True
        return [round(r.uniform(-2.0, 2.0), r.choice([2, 3])) for _ in range(n)], False

    def leaf(self, shp, need):
        r = self.rng
        n = ncells(shp)
        scalar = naxes(shp) == 0
        choices = ["ndarray", "ndarray", "param", "param", "param"]
        if scalar:
            choices += ["number", "number"]
        if need in ("any", "exact", "inf_ok") and n <= 64:
            choices.append("range_of_shape")
            if shp["batch"] == [] and shp["input"] == [] and len(shp["output"]) == 1:
                choices.append("range")
        if need in ("any", "small", "inf_ok") and scalar is False:
            choices.append("uniform param")
        kind = r.choice(choices)
        if kind == "param" and r.random() < 0.35:
            reuse = [(nm, e) for nm, e in self.params.items() if e.shape == shp and fits(e, need)]
            if reuse:
                nm, e = r.choice(reuse)
                self.features["shared param"] += 1
                return Ex({"leaf": "param", "name": nm}, shp, e.lo, e.hi, e.exact)
        self.features["leaf " + kind] += 1
        if kind == "number":
            v, exact = self.values(1, need)
            return Ex({"leaf": "number", "value": v[0]}, shp, v[0], v[0], exact)
        if kind == "range":
            m = shp["output"][0]
            return Ex({"leaf": "range", "n": m}, shp, 0.0, float(max(m - 1, 0)), True)
        if kind == "range_of_shape":
            js = {"leaf": "range_of_shape"}
            for row in ROWS:
                if shp[row] or r.random() < 0.3:
                    js[row] = list(shp[row])
            return Ex(js, shp, 0.0, float(max(n - 1, 0)), True)
        if kind == "ndarray":
            vals, exact = self.values(n, need)
            js = {"leaf": "ndarray", "values": vals}
            for row in ROWS:
                if shp[row] or r.random() < 0.3:
                    js[row] = list(shp[row])
            return Ex(js, shp, min(vals), max(vals), exact)
        return self.new_param(shp, need, uniform=(kind == "uniform param"))

    def new_param(self, shp, need, uniform=False, omit=()):
        """A param of shape ``shp``; the rows in ``omit`` are left for inference."""
        r = self.rng
        self.n_params += 1
        name = f"p{self.n_params}"
        js = {"leaf": "param", "name": name}
        for row in ROWS:
            if row in omit:
                continue
            if row == "batch" and not shp["batch"] and r.random() < 0.5:
                continue
            js[row] = list(shp[row])
        n = ncells(shp)
        if uniform:
            lo = round(r.uniform(-1.5, 0.0), 2)
            hi = round(lo + r.uniform(0.25, 2.0), 2)
            js["init"] = {"uniform": [lo, hi], "seed": r.randint(0, 1000)}
            ex = Ex(js, shp, lo, hi, False)
            self.features["uniform init"] += 1
        elif r.random() < 0.25:
            v, exact = self.values(1, need)
            js["init"] = {"constant": v[0]}
            ex = Ex(js, shp, v[0], v[0], exact)
        else:
            vals, exact = self.values(n, need)
            js["init"] = {"values": vals}
            ex = Ex(js, shp, min(vals), max(vals), exact)
        if omit:
            ex.inferred = True
            self.features["inferred param"] += 1
        else:
            self.params[name] = ex
        return ex

    # ------------------------------------------------------------------------------------------
    # Operations

    def op(self, shp, need, rigid_ok, depth):
        r = self.rng
        kinds = ["unary", "binary", "binary", "einsum1", "einsum", "einsum", "matmul", "where",
                 "compare", "maxmin"]
        if need != "exact":
            kinds += ["unary", "binary", "fma", "tropical", "einmax1"]
        else:
            kinds += ["einmax1", "tropical"]
        if naxes(shp) < MAX_AXES and not (shp["batch"] and "slice-multi-batch" in self.avoid):
            kinds.append("batch_slice")
        kinds.append("transpose")
        if any(d >= 2 for row in ROWS for d in shp[row]):
            kinds += ["concat", "concat"]
        if need == "pos":
            kinds = [k for k in kinds if k not in ("compare",)]
        for _ in range(4):
            kind = r.choice(kinds)
            ex = getattr(self, "op_" + kind)(shp, need, rigid_ok, depth)
            if ex is not None:
                return ex
        return self.leaf(shp, need)

    def split_broadcast(self, shp, n, full=None):
        """``n`` shapes whose pointwise join is ``shp``; argument ``full`` (if given) is ``shp``."""
        r = self.rng
        out = [{k: [] for k in ROWS} for _ in range(n)]
        for row in ROWS:
            dims = shp[row]
            L = len(dims)
            carrier = full if full is not None else r.randrange(n)
            ranks = [L if (k == carrier or r.random() < 0.6) else r.randint(0, L) for k in range(n)]
            for j, d in enumerate(dims):
                covering = [k for k in range(n) if j >= L - ranks[k]]
                provider = carrier if carrier in covering and (full is not None or
                                                               r.random() < 0.5) \
                    else r.choice(covering)
                for k in covering:
                    keep = k == provider or k == full or r.random() < 0.6
                    out[k][row].append(d if keep else 1)
        return [shape(o["batch"], o["input"], o["output"]) for o in out]

    def op_unary(self, shp, need, rigid_ok, depth):
        r = self.rng
        if need == "exact":
            f = r.choice(["neg", "relu", "abs", "not"])
        elif need == "pos":
            f = r.choice(["exp", "sigmoid", "sqrt", "recip", "abs"])
        else:
            f = r.choice(["neg", "relu", "exp", "log", "sqrt", "tanh", "sigmoid", "sin", "cos",
                          "recip", "abs", "not"])
        arg_need = {"exp": "small", "log": "pos", "sqrt": "pos", "recip": "pos",
                    "sigmoid": "any", "tanh": "any", "sin": "small", "cos": "small",
                    "not": "exact" if r.random() < 0.7 else "any"}.get(f, need)
        if f == "abs" and need == "pos":
            arg_need = "pos"
        if f in ("neg", "relu", "abs") and need == "inf_ok":
            arg_need = "any"
        x = self.gen(shp, arg_need, rigid_ok, depth + 1)
        self.features[f] += 1
        lo, hi = x.lo, x.hi
        exact = x.exact and f in ("neg", "relu", "abs", "not")
        iv = {
            "neg": (-hi, -lo), "relu": (max(lo, 0.0), max(hi, 0.0)),
            "exp": (math.exp(lo), math.exp(hi)) if hi < 50 else (0.0, math.inf),
            "log": (math.log(lo), math.log(hi)) if lo > 0 else (-math.inf, math.inf),
            "sqrt": (math.sqrt(max(lo, 0)), math.sqrt(max(hi, 0))),
            "tanh": (math.tanh(lo), math.tanh(hi)), "sigmoid": (0.0, 1.0),
            "sin": (-1.0, 1.0), "cos": (-1.0, 1.0),
            "recip": (1.0 / hi, 1.0 / lo) if lo > 0 else (-math.inf, math.inf),
            "abs": (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi))),
            "not": (0.0, 1.0),
        }[f]
        if f == "sigmoid" and hi - lo < 60:
            iv = (1 / (1 + math.exp(-lo)), 1 / (1 + math.exp(-hi)))
        return Ex({"op": f, "args": [x.js]}, shp, iv[0], iv[1], exact,
                  x.inferred)

    def pointwise_args(self, shp, needs, rigid_ok, depth, allow_inferred=True):
        """Arguments for a pointwise operation producing ``shp``; one may be a param whose rows
        are inferred from the others (only where this node is not broadcast further)."""
        r = self.rng
        n = len(needs)
        full = r.randrange(n)
        shapes = self.split_broadcast(shp, n, full=full)
        inferred_at = None
        if allow_inferred and rigid_ok and n >= 2 and r.random() < 0.15:
            # The param gets the join of the others' input and output rows, which must be shp's.
            k = r.choice([j for j in range(n) if j != full])
            others = [shapes[j] for j in range(n) if j != k]
            if all(self.join([o[row] for o in others]) == shp[row] for row in ("input", "output")):
                inferred_at = k
                shapes[k] = shape(shapes[k]["batch"], shp["input"], shp["output"])
        args = []
        for k in range(n):
            if k == inferred_at:
                batch_given = shapes[k]["batch"] != [] or r.random() < 0.5
                omit = ("input", "output") if r.random() < 0.6 else (r.choice(["input", "output"]),)
                if not batch_given:
                    omit = omit + ("batch",)
                args.append(self.new_param(shapes[k], needs[k], omit=omit))
            else:
                args.append(self.gen(shapes[k], needs[k], rigid_ok and shapes[k] == shp,
                                     depth + 1))
        return args

    @staticmethod
    def join(rows):
        n = max((len(x) for x in rows), default=0)
        out = [1] * n
        for x in rows:
            for j, d in enumerate(x):
                if d != 1:
                    out[n - len(x) + j] = d
        return out

    def op_binary(self, shp, need, rigid_ok, depth):
        r = self.rng
        if need == "exact":
            op = r.choice(["add", "sub", "pointmul"])
        elif need == "pos":
            op = r.choice(["add", "pointmul", "div", "pow"])
        else:
            op = r.choice(["add", "sub", "pointmul", "div", "pow"])
        if op == "div":
            needs = ["small" if need != "pos" else "pos", "pos"]
        elif op == "pow":
            if r.random() < 0.5 and need != "pos":
                needs = ["small", "int_exponent"]
            else:
                needs = ["pos", "small"]
        elif op == "pointmul":
            needs = ["small", "small"] if need != "exact" else ["exact", "exact"]
            if need == "pos":
                needs = ["pos", "pos"]
        else:
            needs = [need if need != "inf_ok" else "any"] * 2
        if "int_exponent" in needs:
            # x^2 or x^3: a number exponent, so no gradient flows into it.
            base = self.gen(shp, "small", rigid_ok, depth + 1)
            e = float(r.choice([2, 3]))
            lo, hi = sorted([base.lo**e, base.hi**e])
            if e == 2 and base.lo < 0 < base.hi:
                lo = 0.0
            self.features["pow"] += 1
            return Ex({"op": "pow", "args": [base.js, {"leaf": "number", "value": e}]}, shp, lo,
                      hi, False, base.inferred)
        a, b = self.pointwise_args(shp, needs, rigid_ok, depth)
        self.features[op] += 1
        if op == "add":
            lo, hi = a.lo + b.lo, a.hi + b.hi
        elif op == "sub":
            lo, hi = a.lo - b.hi, a.hi - b.lo
        elif op == "pointmul":
            lo, hi = mul_iv((a.lo, a.hi), (b.lo, b.hi))
        elif op == "div":
            lo, hi = mul_iv((a.lo, a.hi), (1.0 / b.hi, 1.0 / b.lo))
        else:
            cs = [x**y for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
            lo, hi = min(cs), max(cs)
        exact = a.exact and b.exact and op in ("add", "sub", "pointmul")
        return Ex({"op": op, "args": [a.js, b.js]}, shp, lo, hi, exact,
                  a.inferred or b.inferred)

    def op_maxmin(self, shp, need, rigid_ok, depth):
        r = self.rng
        op = r.choice(["max", "min"])
        sub = need if need in ("exact", "small", "pos") else r.choice(["exact", "any", "small"])
        if r.random() < 0.2:
            # An exact tie: the same node on both sides.
            x = self.gen(shp, sub, rigid_ok, depth + 1)
            if "ref" in x.js:
                other = dict(x.js)
            elif x.js.get("leaf") == "param":
                other = {"leaf": "param", "name": x.js["name"]}
            else:
                if "name" not in x.js:
                    x.js["name"] = self.fresh_name("n")
                    self.pool.append((x.js["name"], x))
                other = {"ref": x.js["name"]}
            self.features["max/min of a node with itself"] += 1
            return Ex({"op": op, "args": [x.js, other]}, shp, x.lo, x.hi, x.exact, x.inferred)
        a, b = self.pointwise_args(shp, [sub, sub], rigid_ok, depth)
        self.features[op] += 1
        f = max if op == "max" else min
        return Ex({"op": op, "args": [a.js, b.js]}, shp, f(a.lo, b.lo), f(a.hi, b.hi),
                  a.exact and b.exact, a.inferred or b.inferred)

    def op_compare(self, shp, need, rigid_ok, depth):
        r = self.rng
        op = r.choice(["lt", "eq", "ne"])
        sub = "exact" if r.random() < 0.75 else "any"
        a, b = self.pointwise_args(shp, [sub, sub], rigid_ok, depth)
        self.features[op] += 1
        return Ex({"op": op, "args": [a.js, b.js]}, shp, 0.0, 1.0, True,
                  a.inferred or b.inferred)

    def one_hot(self, shp):
        """A 0/1 ndarray with one 1 along its last axis (or random 0/1 cells)."""
        r = self.rng
        dims = mem(shp)
        n = ncells(shp)
        if dims and r.random() < 0.6:
            last = dims[-1]
            vals = []
            for _ in range(n // last if last else 0):
                hot = r.randrange(last)
                vals += [1.0 if j == hot else 0.0 for j in range(last)]
        else:
            vals = [float(r.random() < 0.5) for _ in range(n)]
        js = {"leaf": "ndarray", "values": vals}
        for row in ROWS:
            if shp[row]:
                js[row] = list(shp[row])
        self.features["one-hot where mask"] += 1
        return Ex(js, shp, 0.0, 1.0, True)

    def op_where(self, shp, need, rigid_ok, depth):
        r = self.rng
        sub = need if need != "inf_ok" else "any"
        full = r.randrange(3)
        shapes = self.split_broadcast(shp, 3, full=full)
        args = []
        for k in range(3):
            if k == 0 and r.random() < 0.5:
                args.append(self.one_hot(shapes[0]))
            elif k == 0:
                args.append(self.gen(shapes[0], "exact" if r.random() < 0.8 else "any",
                                     rigid_ok and shapes[0] == shp, depth + 1))
            else:
                args.append(self.gen(shapes[k], sub, rigid_ok and shapes[k] == shp, depth + 1))
        c, a, b = args
        self.features["where"] += 1
        return Ex({"op": "where", "args": [c.js, a.js, b.js]}, shp, min(a.lo, b.lo),
                  max(a.hi, b.hi), a.exact and b.exact, any(x.inferred for x in args))

    def op_matmul(self, shp, need, rigid_ok, depth, fma=False):
        r = self.rng
        kdims = [self.size(1, 4) for _ in range(r.choice([0, 1, 1, 1, 2]))]
        room = MAX_AXES - len(shp["batch"]) - len(kdims)
        if room < max(len(shp["output"]), len(shp["input"])):
            kdims = []
        ba, bb = self.split_broadcast(shape(shp["batch"]), 2)
        kb = list(kdims)
        if kb and r.random() < 0.25:
            # The second argument's output axes may broadcast against the first's input axes.
            kb = [1 if r.random() < 0.5 else d for d in kb]
            if r.random() < 0.3:
                kb = kb[1:]
            self.features["matmul contraction broadcast"] += 1
        sa = shape(ba["batch"], kdims, shp["output"])
        sb = shape(bb["batch"], shp["input"], kb)
        sub = "exact" if need == "exact" else "small"
        k = math.prod(kdims) if kdims else 1
        mode = r.random()
        if mode < 0.12 and kb == kdims:
            a = self.new_param(sa, sub, omit=("input",))
            a.inferred = False  # its input row is bounded by b's output row alone
            self.features["param input inferred from matmul"] += 1
            b = self.gen(sb, sub, False, depth + 1)
        elif mode < 0.24:
            a = self.gen(sa, sub, False, depth + 1)
            sb = shape(sb["batch"], sb["input"], kdims)
            b = self.new_param(sb, sub, omit=("output",))
            b.inferred = False  # its output row is bounded by a's input row alone
            self.features["param output inferred from matmul"] += 1
        else:
            a = self.gen(sa, sub, False, depth + 1)
            b = self.gen(sb, sub, False, depth + 1)
        lo, hi = mul_iv((a.lo, a.hi), (b.lo, b.hi))
        lo, hi = min(lo * k, lo), max(hi * k, hi)
        args = [a.js, b.js]
        exact = a.exact and b.exact
        inferred = a.inferred or b.inferred
        if fma:
            cs = self.split_broadcast(shp, 2, full=0)[1]
            c = self.gen(cs, sub, False, depth + 1)
            args.append(c.js)
            lo, hi = lo + c.lo, hi + c.hi
            exact = exact and c.exact
        self.features["fma" if fma else "matmul"] += 1
        return Ex({"op": "fma" if fma else "matmul", "args": args}, shp, lo, hi, exact, inferred)

    def op_fma(self, shp, need, rigid_ok, depth):
        return self.op_matmul(shp, need, rigid_ok, depth, fma=True)

    def op_transpose(self, shp, need, rigid_ok, depth):
        x = self.gen(shape(shp["batch"], shp["output"], shp["input"]), need, rigid_ok, depth + 1)
        self.features["transpose"] += 1
        return Ex({"op": "transpose", "args": [x.js]}, shp, x.lo, x.hi, x.exact, x.inferred)

    def op_batch_slice(self, shp, need, rigid_ok, depth):
        r = self.rng
        n = self.size(1, 4)
        x = self.gen(shape([n] + shp["batch"], shp["input"], shp["output"]), need, rigid_ok,
                     depth + 1)
        self.features["batch_slice"] += 1
        return Ex({"op": "batch_slice", "index": r.randrange(n), "args": [x.js]}, shp, x.lo,
                  x.hi, x.exact, x.inferred)

    def op_concat(self, shp, need, rigid_ok, depth):
        r = self.rng
        cands = [(row, j) for row in ROWS for j, d in enumerate(shp[row]) if d >= 2]
        row, j = r.choice(cands)
        d = shp[row][j]
        nparts = 2 if d < 3 or r.random() < 0.6 else 3
        cuts = sorted(r.sample(range(1, d), nparts - 1))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [d])]
        names = NameSource(r, multi=True)
        comp = []
        for s in sizes:
            same = [c for c, cs in comp if cs == s]
            if same and r.random() < 0.3 and "concat-repeat" not in self.avoid:
                comp.append((same[0], s))
                self.features["concat repeated label a^a"] += 1
            else:
                comp.append((names.new(), s))
        # The other axes: one label each, or a row variable for the axes before the concat axis.
        tmpl = {k: [] for k in ROWS}
        for rr in ROWS:
            dims = shp[rr]
            use_var = rr == row and j > 0 and r.random() < 0.4
            for jj, dd in enumerate(dims):
                if rr == row and jj == j:
                    tmpl[rr].append(("CAT", None))
                elif use_var and jj < j:
                    if jj == 0:
                        tmpl[rr].append(("VAR", "..." if r.random() < 0.5 else
                                         "..%s.." % names.new()))
                else:
                    tmpl[rr].append(("L", names.new()))
        if any(it[0] == "VAR" for it in tmpl[row]):
            self.features["concat under a row variable"] += 1
        order = list(range(nparts))
        repeated = len({c for c, _ in comp}) < nparts
        if not repeated and r.random() < 0.3:
            r.shuffle(order)
            if order != sorted(order):
                self.features["concat parts out of argument order"] += 1
        # Argument k fills part order[k].
        args, operand_texts = [], []
        lo, hi, exact, inferred = math.inf, -math.inf, True, False
        for k in range(nparts):
            part = order[k]
            lab, s = comp[part]
            ashp = {rr: list(shp[rr]) for rr in ROWS}
            ashp[row][j] = s
            ashp = shape(ashp["batch"], ashp["input"], ashp["output"])
            x = self.gen(ashp, need if need != "inf_ok" else "any", rigid_ok, depth + 1)
            args.append(x.js)
            lo, hi = min(lo, x.lo), max(hi, x.hi)
            exact, inferred = exact and x.exact, inferred or x.inferred
            operand_texts.append(self.concat_row_text(tmpl, lab))
        result = self.concat_row_text(tmpl, "^".join(c for c, _ in comp))
        spec = "; ".join(operand_texts) + " => " + result
        self.features["concat"] += 1
        return Ex({"op": "concat", "spec": spec, "args": args}, shp, lo, hi, exact, inferred)

    @staticmethod
    def concat_row_text(tmpl, cat):
        parts = {}
        for rr in ROWS:
            items = []
            for kind, v in tmpl[rr]:
                items.append(cat if kind == "CAT" else v)
            parts[rr] = ", ".join(items)
        return shape_text(parts)

    # ------------------------------------------------------------------------------------------
    # The einsum family

    def op_einsum1(self, shp, need, rigid_ok, depth):
        return self.einsum_family("einsum1", shp, need, rigid_ok, depth)

    def op_einmax1(self, shp, need, rigid_ok, depth):
        return self.einsum_family("einmax1", shp, need, rigid_ok, depth)

    def op_einsum(self, shp, need, rigid_ok, depth):
        return self.einsum_family("einsum", shp, need, rigid_ok, depth)

    def op_tropical(self, shp, need, rigid_ok, depth):
        return self.einsum_family("tropical", shp, need, rigid_ok, depth)

    def einsum_family(self, op, shp, need, rigid_ok, depth):
        r = self.rng
        n_ops = 1 if op in ("einsum1", "einmax1") else 2
        is_max = op in ("einmax1", "tropical")
        # Placements leave cells unwritten: -inf for a max, which only some contexts accept.
        allow_place = not is_max or need == "inf_ok"
        plan = EinsumBuilder(self, shp, n_ops, allow_place).build()
        if plan is None:
            return None
        # Operand values: products stay small; a tropical sum of two small values too.
        if op == "einsum":
            sub = "exact" if need == "exact" else "small"
        elif op == "tropical":
            sub = "exact" if need in ("exact",) else r.choice(["small", "exact"])
        else:
            sub = need if need in ("exact", "small", "pos") else "any"
        args = []
        for k in range(n_ops):
            ashp = plan.arg_shapes[k]
            if plan.inferable == k and (plan.inferable_strong or rigid_ok):
                omit = ("input", "output") if r.random() < 0.6 else (r.choice(["input", "output"]),)
                if not ashp["batch"]:
                    omit += ("batch",)
                x = self.new_param(ashp, sub, omit=omit)
                x.inferred = not plan.inferable_strong
                self.features["param inferred from einsum operands"] += 1
            else:
                x = self.gen(ashp, sub, rigid_ok and plan.rigid_arg[k], depth + 1)
            args.append(x)
        n = plan.n_reduced
        if op == "einsum":
            lo, hi = mul_iv((args[0].lo, args[0].hi), (args[1].lo, args[1].hi))
            lo, hi = min(lo * n, lo, 0.0 if plan.unwritten else lo), \
                max(hi * n, hi, 0.0 if plan.unwritten else hi)
        elif op == "einsum1":
            lo, hi = args[0].lo, args[0].hi
            lo, hi = min(lo * n, lo), max(hi * n, hi)
            if plan.unwritten:
                lo, hi = min(lo, 0.0), max(hi, 0.0)
        elif op == "tropical":
            lo, hi = args[0].lo + args[1].lo, args[0].hi + args[1].hi
        else:
            lo, hi = args[0].lo, args[0].hi
        if is_max and plan.unwritten:
            lo = -math.inf
        exact = all(a.exact for a in args)
        self.features[op] += 1
        for f in plan.features:
            self.features["spec: " + f] += 1
        return Ex({"op": op, "spec": plan.spec, "args": [a.js for a in args]}, shp, lo, hi,
                  exact, any(a.inferred for a in args))


class NameSource:
    """Fresh axis labels: single letters, or identifiers for multi-character specs."""

    def __init__(self, rng, multi):
        self.rng, self.multi = rng, multi
        self.used = set()

    def new(self):
        pool = MULTI_NAMES if self.multi else list("abcdefghijklmnopqrstuvwxyz")
        free = [n for n in pool if n not in self.used]
        if not free:
            free = [f"q{len(self.used)}x"]
        n = self.rng.choice(free)
        self.used.add(n)
        return n


def shape_text(parts):
    """``batch|input->output`` from row texts; omits empty batch and input rows."""
    out = ""
    if parts["batch"]:
        out += parts["batch"] + "|"
    if parts["input"]:
        out += parts["input"] + "->"
    return out + parts["output"]


class EinsumPlanOut:
    def __init__(self):
        self.spec = ""
        self.arg_shapes = []
        self.rigid_arg = []
        self.n_reduced = 1
        self.unwritten = False
        self.features = []
        self.inferable = None
        self.inferable_strong = False


class EinsumBuilder:
    """Builds an einsum-family spec producing a given shape, and its arguments' shapes.

    Items: ``("L", label)``, ``("F", index)``, ``("C", stride, out, dilation, kernel)``,
    ``("V", var)`` where ``var`` is ``"..."`` or a name."""

    def __init__(self, gen, shp, n_ops, allow_place):
        self.g, self.r = gen, gen.rng
        self.shp, self.n, self.allow_place = shp, n_ops, allow_place

    def build(self):
        r, n = self.r, self.n
        out = EinsumPlanOut()
        multi = r.random() < 0.45
        names = NameSource(r, multi)
        size = {}  # label -> size
        holders = {}  # label -> operands holding it
        rv_val = {}  # row variable -> its axes (sizes)
        rv_holders = {}
        res = {k: [] for k in ROWS}
        feats = out.features
        # Result rows.
        for row in ROWS:
            dims = list(self.shp[row])
            items = []
            if r.random() < 0.3:
                m = r.randint(0, min(2, len(dims)))
                var = "..." if r.random() < 0.6 else names.new()
                var_key = ("...", row) if var == "..." else var
                rv_val[var_key] = dims[:m]
                items.append(("V", var, var_key))
                dims = dims[m:]
                feats.append("row variable" if var == "..." else "named row variable")
            for d in dims:
                x = r.random()
                prev = [it for it in items if it[0] == "L" and size[it[1]] == d]
                if self.allow_place and x < 0.12:
                    items.append(("F", d - 1))
                    feats.append("fixed index in result")
                    out.unwritten = out.unwritten or d > 1
                elif self.allow_place and prev and x < 0.2:
                    items.append(prev[0])
                    feats.append("label repeated in result")
                    out.unwritten = True
                else:
                    lab = names.new()
                    size[lab] = d
                    items.append(("L", lab))
            res[row] = items
        # Where the result's labels and row variables come from.
        for row in ROWS:
            for it in res[row]:
                if it[0] == "L" and it[1] not in holders:
                    d = size[it[1]]
                    if d == 1 and r.random() < 0.15:
                        holders[it[1]] = []
                        feats.append("result-only label")
                    else:
                        holders[it[1]] = self.pick_holders()
                elif it[0] == "V":
                    if not rv_val[it[2]] and r.random() < 0.2:
                        rv_holders[it[2]] = []
                    else:
                        rv_holders[it[2]] = self.pick_holders()
        # Sometimes every label of operand 1 also comes from operand 0, so that operand 1 can be
        # a param whose rows are inferred from operand 0.
        subset = n == 2 and r.random() < 0.2
        if subset:
            for lab, hs in holders.items():
                if hs == [1]:
                    holders[lab] = [0, 1]
            for key, hs in rv_holders.items():
                if 1 in hs:
                    rv_holders[key] = [0]
        # Reduced labels.
        for _ in range(r.choice([0, 0, 1, 1, 2])):
            lab = names.new()
            size[lab] = self.g.size(1, 4)
            holders[lab] = self.pick_holders()
            out.n_reduced *= size[lab]
            feats.append("reduced label")
        # Operand items.
        ops = [[] for _ in range(n)]
        for lab, hs in holders.items():
            for k in hs:
                ops[k].append(("L", lab))
        for key, hs in rv_holders.items():
            for k in hs:
                ops[k].append(("V", key[0] if isinstance(key, tuple) else key, key))
        if r.random() < 0.15 and not subset:
            # A row variable only in an operand: its axes are reduced.
            k = r.randrange(n)
            key = names.new()
            rv_val[key] = [self.g.size(1, 3) for _ in range(r.randint(1, 2))]
            ops[k].append(("V", key, key))
            out.n_reduced *= math.prod(rv_val[key])
            feats.append("reduced row variable")
        if r.random() < 0.2:
            k = 0 if subset else r.randrange(n)
            ops[k].append(("F", r.randint(0, 3)))
            feats.append("fixed index in operand")
        if r.random() < 0.1:
            k = 0 if subset else r.randrange(n)
            labs = [it for it in ops[k] if it[0] == "L"]
            if labs:
                ops[k].append(r.choice(labs))
                feats.append("diagonal in operand")
        # Convolution axes: a result label read as stride*o + dilation*k in operand 0.
        conv = None
        if r.random() < 0.3 and not subset:
            cands = [lab for lab, hs in holders.items() if hs == [0] and size[lab] >= 1
                     and sum(1 for it in ops[0] if it == ("L", lab)) == 1]
            if cands:
                o = r.choice(cands)
                stride = r.choice([1, 1, 2, 3])
                if n == 2 and r.random() < 0.85:
                    multi = names.multi = True  # convolutions need multi-character mode
                    kname = names.new()
                    ks = r.choice([1, 2, 2, 3])
                    dil = r.choice([1, 1, 2])
                    span = stride * (size[o] - 1) + dil * (ks - 1) + 1
                    if 2 <= span <= 12:
                        size[kname] = ks
                        holders[kname] = [1]
                        ops[1].append(("L", kname))
                        conv = ("C", stride, o, dil, kname)
                        out.n_reduced *= ks
                        feats.append("convolution" + (" kernel of size 1" if ks == 1 else "")
                                     + (" dilated" if dil > 1 else "")
                                     + (" strided" if stride > 1 else ""))
                elif stride > 1 and stride * size[o] <= 12:
                    conv = ("C", stride, o, 1, None)
                    feats.append("pure stride")
                if conv is not None:
                    ops[0] = [conv if it == ("L", o) else it for it in ops[0]]
                    multi = True
        if multi:
            names.multi = True
        # Spread each operand's items over its rows; `...` stays in its own row kind.
        tmpls = []
        for k in range(n):
            rows = {row: [] for row in ROWS}
            var_rows = {}
            for it in ops[k]:
                if it[0] == "V":
                    key = it[2]
                    if isinstance(key, tuple):
                        row = key[1]
                    else:
                        free = [row for row in ROWS if row not in var_rows]
                        row = r.choice(free) if free else None
                    if row is None or row in var_rows:
                        return None
                    var_rows[row] = it
                else:
                    rows[r.choice(ROWS)].append(it)
            for row in ROWS:
                r.shuffle(rows[row])
                if row in var_rows:
                    pos = r.randint(0, len(rows[row]))
                    rows[row].insert(pos, var_rows[row])
            tmpls.append(rows)
        # Argument shapes: the first holder of a label gets its size, later ones may broadcast.
        first = {}
        for k in range(n):
            for row in ROWS:
                for it in tmpls[k][row]:
                    if it[0] == "L":
                        first.setdefault(it[1], k)
        arg_shapes, rigid = [], []
        for k in range(n):
            rows = {}
            is_rigid = True
            for row in ROWS:
                dims = []
                items = tmpls[k][row]
                has_var = any(it[0] == "V" for it in items)
                for it in items:
                    if it[0] == "L":
                        d = size[it[1]]
                        if first[it[1]] != k and d > 1 and r.random() < 0.2:
                            d = 1
                            is_rigid = False
                            feats.append("operand axis of size 1 broadcast")
                        dims.append(d)
                    elif it[0] == "F":
                        dims.append(it[1] + self.g.size(1, 3))
                    elif it[0] == "C":
                        _, s, o, dil, kname = it
                        dims.append(s * (size[o] - 1) + dil * (size[kname] - 1) + 1
                                    if kname else s * size[o])
                    else:
                        dims.extend(rv_val[it[2]])
                # Missing leading axes broadcast (only without a row variable in the row).
                if not has_var and items and items[0][0] == "L" and first[items[0][1]] != k \
                        and r.random() < 0.3:
                    dims = dims[1:]
                    is_rigid = False
                    feats.append("operand missing a leading axis")
                rows[row] = dims
            s = shape(rows["batch"], rows["input"], rows["output"])
            if naxes(s) > MAX_AXES + 1:
                return None
            arg_shapes.append(s)
            rigid.append(is_rigid)
        total = math.prod(size.values()) * math.prod(math.prod(v) for v in rv_val.values())
        if total > MAX_ITER:
            return None
        # An operand whose labels all come from the other operand can be an inferred param.
        if n == 2 and (subset or self.r.random() < 0.25):
            for k in (1, 0):
                other = 1 - k
                t = tmpls[k]
                ok = all(it[0] == "L" and other in holders.get(it[1], []) and first[it[1]] == other
                         for row in ("input", "output") for it in t[row]) \
                    and not t["batch"] and any(t[row] for row in ("input", "output"))
                if ok and arg_shapes[k] == shape([], [size[it[1]] for it in t["input"]],
                                                 [size[it[1]] for it in t["output"]]):
                    out.inferable = k
                    out.inferable_strong = all(size[it[1]] > 1 for row in ("input", "output")
                                               for it in t[row])
                    break
        out.arg_shapes, out.rigid_arg = arg_shapes, rigid
        out.spec = self.text(tmpls, res, multi)
        return out

    def pick_holders(self):
        if self.n == 1:
            return [0]
        return self.r.choice([[0], [1], [0, 1], [0, 1]])

    def text(self, tmpls, res, multi):
        r = self.r

        def item(it):
            if it[0] == "L":
                return it[1]
            if it[0] == "F":
                return str(it[1])
            if it[0] == "V":
                return "..." if it[1] == "..." else f"..{it[1]}.."
            _, s, o, dil, k = it
            head = f"{s}*{o}" if s != 1 or r.random() < 0.3 else o
            if k is None:
                return head
            return f"{head}+{dil}*{k}" if dil != 1 or r.random() < 0.3 else f"{head}+{k}"

        sep = ", " if r.random() < 0.7 else " "
        if multi and not any(len(t[row]) > 1 for t in tmpls + [res] for row in ROWS):
            sep = ", "

        def row_text(items):
            toks = [item(it) for it in items]
            if multi:
                return sep.join(toks) if toks else ""
            s = ""
            for t in toks:
                if s and s[-1].isdigit() and t[0].isdigit():
                    s += " "
                s += t
            return s

        def shp_text(rows):
            return shape_text({row: row_text(rows[row]) for row in ROWS})

        spec = "; ".join(shp_text(t) for t in tmpls) + " => " + shp_text(res)
        if multi and not any(c in spec for c in ",*+^"):
            # No row has two axes, so the spec reads in single-character mode: rename the labels.
            return self.retry_single(tmpls, res)
        return spec

    def retry_single(self, tmpls, res):
        """Renames multi-letter labels to single letters when no row has two axes."""
        mapping = {}
        letters = iter("abcdefghijklmnopqrstuvwxyz")
        for t in tmpls + [res]:
            for row in ROWS:
                for it in t[row]:
                    if it[0] == "L" and it[1] not in mapping:
                        mapping[it[1]] = next(letters)

        def ren(rows):
            out = {}
            for row in ROWS:
                out[row] = []
                for it in rows[row]:
                    if it[0] == "L":
                        it = ("L", mapping[it[1]])
                    elif it[0] == "V" and it[1] != "...":
                        it = ("V", mapping.setdefault("..v" + it[1], next(letters)), it[2])
                    out[row].append(it)
            return out

        return self.text([ren(t) for t in tmpls], ren(res), False)


def generate(seed, avoid=frozenset()):
    """One document from ``seed``: (document, expected root shape, features used)."""
    g = Generator(seed, avoid)
    for _ in range(50):
        try:
            doc, shp = g.document()
            return doc, shp, g.features
        except RecursionError:
            g = Generator(g.rng.random(), avoid)
    raise RuntimeError("no document")


if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    for i in range(count):
        print(json.dumps(generate(seed * 1_000_003 + i)[0]))
