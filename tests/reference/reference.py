"""An independent reference evaluator for rocannl's tensor-expression documents.

Why this file exists: the differential test (``difftest.py``) needs a second opinion on every
answer ``rocannl eval`` gives. This module is written from the document contract alone
(``expr-json.md`` in the shared specification, with ``docs/einsum.md``) and shares no code or
design with the Rust implementation: it parses a document, computes the shapes the contract
implies bottom-up, evaluates every leaf and operation with numpy, and backpropagates by hand-derived
rules.

Every value carries a first-order error bound alongside it (class ``EV``): how far a correct
implementation working in the requested precision may be from the exact result, counted in units
of that precision's unit roundoff ``u``. The bound grows by one rounding per operation (none when
the result is provably exact: all inputs exact and the result an integer multiple of a power of two
that fits in 24 bits), by ``(n-1)·Σ|terms|`` for a sum of ``n`` terms (valid for any summation
order), by a few ulps for library functions, and carries input errors through the derivative.
Cells whose value depends on a decision the errors make uncertain (a comparison, ``where``, a max
or a kink of ``relu``/``abs`` whose arguments are closer than their errors) are marked ambiguous
and not compared. ``difftest.py`` compares the tool's cells with ``|tool - ref| <= SAFETY·e·u``.

Shapes: the reference does not solve the contract's inequalities in general. It computes shapes
bottom-up from the arguments, and infers an omitted param row only where the param is a direct
argument of an operation whose other arguments determine it (see ``Evaluator._resolve_params``);
anything else raises ``Unsupported``. The generator only omits rows in those positions.
"""

import re

import numpy as np

# Tolerances are SAFETY · (error bound) · u. The bound is first order and each of the two
# evaluations compared (the tool's and, in f64, this one) stays within it; the factor 4 covers
# both evaluations (2) and the neglected second-order terms and library-function differences (2).
SAFETY = 4.0
# A library function (exp, log, tanh, ...) may be off by 2 ulps = 4 u of its result.
LIBM_U = 4.0
# Exact arithmetic: integers of up to 24 bits times a power of two are exact in f32 and f64.
EXACT_LIMIT = float(2**24)

UNIT_ROUNDOFF = {"f32": 2.0**-24, "f64": 2.0**-53}

ROWS = ("batch", "input", "output")


class DocError(Exception):
    """The document is invalid under the contract; ``kind`` is the error kind it implies."""

    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class Unsupported(Exception):
    """A valid document whose shapes need more inference than this reference does."""


# ----------------------------------------------------------------------------------------------
# Values with error bounds


def fabs(x):
    """|x| for finite cells, 0 for non-finite ones (they carry no rounding error)."""
    a = np.abs(x)
    return np.where(np.isfinite(a), a, 0.0)


def granule(x):
    """The largest power of two dividing each finite cell (inf for 0 and non-finite cells)."""
    x = np.asarray(x, dtype=float)
    fin = np.isfinite(x)
    m, ex = np.frexp(np.where(fin, x, 1.0))
    mi = np.abs(m * 2.0**53).astype(np.int64)
    low = mi & -mi
    g = np.ldexp(low.astype(float), ex - 53)
    return np.where(fin & (x != 0), g, np.inf)


def times_err(mag, err):
    """mag·err where a zero magnitude or a zero error gives exactly 0 (no 0·inf)."""
    with np.errstate(all="ignore"):
        return np.where((mag == 0) | (err == 0), 0.0, mag * err)


class EV:
    """Cells ``v`` (float64), error bounds ``e`` (units of u, finite, >= 0) and ambiguity flags."""

    __slots__ = ("v", "e", "amb")

    def __init__(self, v, e=None, amb=None):
        self.v = np.asarray(v, dtype=float)
        self.e = np.zeros(self.v.shape) if e is None else np.asarray(e, dtype=float)
        self.amb = np.zeros(self.v.shape, dtype=bool) if amb is None else np.asarray(amb, bool)

    @staticmethod
    def const(x, shape):
        return EV(np.full(shape, float(x)))

    def exact_zero(self):
        return (self.v == 0) & (self.e == 0) & ~self.amb

    def reshape(self, shape):
        return EV(self.v.reshape(shape), self.e.reshape(shape), self.amb.reshape(shape))


class Arith:
    """Arithmetic on ``EV`` cells in one precision; optionally records every discrete decision
    (comparison outcomes, branch choices, arg-maxima) so that finite differences can tell when a
    perturbation crossed a discontinuity."""

    def __init__(self, precision, trace=False):
        self.precision = precision
        self.u = UNIT_ROUNDOFF[precision]
        self.trace = [] if trace else None

    def record(self, decision):
        if self.trace is not None:
            self.trace.append(np.asarray(decision).copy())

    def close(self, d, ea, eb):
        """|d| is within the combined error of two values: a comparison could go either way."""
        return np.abs(d) <= SAFETY * (ea + eb) * self.u

    @staticmethod
    def finish(v, e, amb):
        v = np.asarray(v, dtype=float)
        e = np.where(np.isfinite(v), e, 0.0)
        bad = ~np.isfinite(e)
        return EV(v, np.where(bad, 0.0, e), amb | bad)

    # -- exactness-aware basic operations

    def add(self, a, b, sign=1.0):
        with np.errstate(all="ignore"):
            v = a.v + sign * b.v
        ep = a.e + b.e
        total = fabs(a.v) + fabs(b.v)
        exact = (ep == 0) & (total < EXACT_LIMIT * np.minimum(granule(a.v), granule(b.v)))
        return self.finish(v, ep + np.where(exact, 0.0, fabs(v)), a.amb | b.amb)

    def sub(self, a, b):
        return self.add(a, b, -1.0)

    def neg(self, a):
        return EV(-a.v, a.e, a.amb)

    def mul(self, a, b):
        with np.errstate(all="ignore"):
            v = a.v * b.v
            ep = times_err(fabs(b.v), a.e) + times_err(fabs(a.v), b.e)
            exact = (ep == 0) & (fabs(v) < EXACT_LIMIT * granule(a.v) * granule(b.v))
        amb = (a.amb & ~b.exact_zero()) | (b.amb & ~a.exact_zero())
        return self.finish(v, ep + np.where(exact, 0.0, fabs(v)), amb)

    def div(self, a, b):
        with np.errstate(all="ignore"):
            v = a.v / b.v
            bb = fabs(b.v)
            ep = times_err(1.0 / bb, a.e) + times_err(fabs(a.v) / (bb * bb), b.e)
            pow2 = (granule(b.v) == bb) & (bb > 0)
            exact = (ep == 0) & pow2 & ((fabs(v) >= 2.0**-100) | (v == 0))
        return self.finish(v, ep + np.where(exact, 0.0, fabs(v)), a.amb | b.amb)

    def unary(self, name, x):
        """Pointwise unary operations other than relu, abs and not."""
        xv = x.v
        with np.errstate(all="ignore"):
            if name == "exp":
                v = np.exp(xv)
                d = v
                rnd = LIBM_U * fabs(v)
            elif name == "log":
                v = np.log(xv)
                d = 1.0 / xv
                rnd = LIBM_U * (fabs(v) + 1.0)
            elif name == "sqrt":
                v = np.sqrt(xv)
                d = 0.5 / v
                rnd = fabs(v)
            elif name == "tanh":
                v = np.tanh(xv)
                d = 1.0 - v * v
                rnd = LIBM_U * (fabs(v) + 1.0)
            elif name == "sigmoid":
                v = 1.0 / (1.0 + np.exp(-xv))
                d = v * (1.0 - v)
                rnd = LIBM_U * (fabs(v) + 1.0)
            elif name == "sin":
                v = np.sin(xv)
                d = np.cos(xv)
                rnd = LIBM_U * (fabs(v) + 1.0)
            elif name == "cos":
                v = np.cos(xv)
                d = -np.sin(xv)
                rnd = LIBM_U * (fabs(v) + 1.0)
            elif name == "recip":
                v = 1.0 / xv
                d = -1.0 / (xv * xv)
                rnd = fabs(v)
            else:
                raise ValueError(name)
            e = times_err(fabs(d), x.e) + rnd
        return self.finish(v, e, x.amb.copy())

    def relu(self, x):
        v = np.maximum(x.v, 0.0)
        clearly_negative = x.v < -SAFETY * x.e * self.u
        self.record(np.sign(x.v))
        return self.finish(v, np.where(clearly_negative, 0.0, x.e), x.amb.copy())

    def abs(self, x):
        self.record(np.sign(x.v))
        return EV(np.abs(x.v), x.e, x.amb)

    def pow(self, a, b):
        with np.errstate(all="ignore"):
            v = np.power(a.v, b.v)
            lna = np.log(np.abs(a.v))
            da = b.v * np.power(a.v, b.v - 1.0)
            db = v * lna
            ep = times_err(fabs(da), a.e) + times_err(fabs(db), b.e)
            rnd = LIBM_U * fabs(v) * (1.0 + fabs(b.v * lna))
        return self.finish(v, ep + rnd, a.amb | b.amb)

    def maxmin(self, a, b, is_max):
        d = a.v - b.v
        sure = ~self.close(d, a.e, b.e)
        with np.errstate(invalid="ignore"):
            v = np.maximum(a.v, b.v) if is_max else np.minimum(a.v, b.v)
        first = (d > 0) if is_max else (d < 0)
        second = (d < 0) if is_max else (d > 0)
        e = np.where(sure & first, a.e, np.where(sure & second, b.e, np.maximum(a.e, b.e)))
        self.record(np.sign(d))
        return self.finish(v, e, a.amb | b.amb)

    def compare(self, op, a, b):
        with np.errstate(invalid="ignore"):
            if op == "lt":
                v = a.v < b.v
            elif op == "eq":
                v = a.v == b.v
            else:
                v = a.v != b.v
        both_exact = (a.e == 0) & (b.e == 0)
        amb = a.amb | b.amb | (self.close(a.v - b.v, a.e, b.e) & ~both_exact)
        self.record(v)
        return EV(v.astype(float), None, amb)

    def logical_not(self, x):
        v = (x.v == 0).astype(float)
        amb = x.amb | ((np.abs(x.v) <= SAFETY * x.e * self.u) & (x.e > 0))
        self.record(v)
        return EV(v, None, amb)

    def where(self, c, a, b):
        take = c.v != 0
        c_amb = c.amb | ((np.abs(c.v) <= SAFETY * c.e * self.u) & (c.e > 0))
        self.record(take)
        return EV(np.where(take, a.v, b.v), np.where(take, a.e, b.e),
                  c_amb | np.where(take, a.amb, b.amb))

    # -- reductions over projections

    def scatter_sum(self, terms, flat, size):
        """Sums ``terms`` (1-D over the iteration space) into ``size`` cells at ``flat``."""
        v = np.zeros(size)
        with np.errstate(all="ignore"):
            np.add.at(v, flat, terms.v)
        mag = np.zeros(size)
        np.add.at(mag, flat, fabs(terms.v))
        err = np.zeros(size)
        np.add.at(err, flat, terms.e)
        count = np.zeros(size)
        np.add.at(count, flat, 1.0)
        gmin = np.full(size, np.inf)
        np.minimum.at(gmin, flat, granule(terms.v))
        amb = np.zeros(size, dtype=bool)
        np.logical_or.at(amb, flat, terms.amb)
        exact = (err == 0) & (mag < EXACT_LIMIT * gmin)
        rnd = np.where(exact, 0.0, np.maximum(count - 1.0, 0.0) * mag)
        return self.finish(v, err + rnd, amb)

    def scatter_max(self, terms, flat, size):
        """Maximum of ``terms`` per cell (``-inf`` where nothing is written), and the routing of
        the gradient: weights per term, and which terms' gradients are ambiguous."""
        v = np.full(size, -np.inf)
        np.maximum.at(v, flat, terms.v)
        err = np.zeros(size)
        np.maximum.at(err, flat, terms.e)
        amb = np.zeros(size, dtype=bool)
        np.logical_or.at(amb, flat, terms.amb)
        gap = v[flat] - terms.v
        near = gap <= SAFETY * (terms.e + err[flat]) * self.u
        n_near = np.zeros(size)
        np.add.at(n_near, flat, near.astype(float))
        unique = n_near[flat] == 1
        weight = np.where(near, 1.0 / np.maximum(n_near[flat], 1.0), 0.0)
        route_amb = (near & ~unique) | amb[flat]
        self.record(near)
        return self.finish(v, err, amb), weight, route_amb


# ----------------------------------------------------------------------------------------------
# Shapes


def zero_where(x, mask):
    """``x`` with the cells under ``mask`` exactly 0 (and decided)."""
    v = np.where(mask, 0.0, x.v)
    return EV(v, np.where(mask, 0.0, x.e), np.where(mask, False, x.amb))


def mem_dims(shape):
    """Memory order: batch, output, input."""
    return list(shape["batch"]) + list(shape["output"]) + list(shape["input"])


def row_offsets(shape):
    nb, no = len(shape["batch"]), len(shape["output"])
    return {"batch": 0, "output": nb, "input": nb + no}


def make_shape(batch=(), input=(), output=()):
    return {"batch": [int(d) for d in batch], "input": [int(d) for d in input],
            "output": [int(d) for d in output]}


def broadcast_rows(rows, what):
    """NumPy-style join of rows aligned from the right; size-1 axes broadcast."""
    n = max((len(r) for r in rows), default=0)
    out = [1] * n
    for r in rows:
        for j, d in enumerate(r):
            k = n - len(r) + j
            if d != 1:
                if out[k] != 1 and out[k] != d:
                    raise DocError("shape", f"{what}: sizes {out[k]} and {d} do not broadcast")
                out[k] = d
    return out


def shape_str(s):
    return f"{','.join(map(str, s['batch']))}|{','.join(map(str, s['input']))}->" \
           f"{','.join(map(str, s['output']))}"


# ----------------------------------------------------------------------------------------------
# Projections: an iteration space and, per tensor, an index expression per axis


class Proj:
    """``sizes`` of the iteration variables; ``index`` turns per-axis expressions
    ``(const, [(coef, var), ...])`` into flat cell offsets over the whole iteration space."""

    def __init__(self, sizes):
        self.sizes = [int(s) for s in sizes]
        self.count = int(np.prod(self.sizes)) if self.sizes else 1
        if self.count > 2_000_000:
            raise Unsupported(f"iteration space of {self.count} points")
        self.grid = np.indices(self.sizes).reshape(len(self.sizes), -1) if self.sizes else None

    def index(self, dims, exprs):
        flat = np.zeros(self.count, dtype=np.int64)
        stride = 1
        for axis in range(len(dims) - 1, -1, -1):
            const, terms = exprs[axis]
            idx = np.full(self.count, const, dtype=np.int64)
            for coef, var in terms:
                idx = idx + coef * self.grid[var]
            if self.count and (idx.min() < 0 or idx.max() >= dims[axis]):
                raise DocError("shape", f"an index runs outside an axis of size {dims[axis]}")
            flat += idx * stride
            stride *= dims[axis]
        return flat


def gather(ev, flat):
    return EV(ev.v.ravel()[flat], ev.e.ravel()[flat], ev.amb.ravel()[flat])


def pointwise_proj(result, args):
    """The iteration space of a pointwise operation and each argument's broadcast index."""
    rdims = mem_dims(result)
    proj = Proj(rdims)
    roff = row_offsets(result)
    out_idx = proj.index(rdims, [(0, [(1, j)]) for j in range(len(rdims))])
    idxs = []
    for a in args:
        exprs = []
        for row in ("batch", "output", "input"):
            ar, rr = a[row], result[row]
            for j, d in enumerate(ar):
                k = roff[row] + len(rr) - len(ar) + j
                exprs.append((0, []) if d == 1 and rr[len(rr) - len(ar) + j] != 1
                             else (0, [(1, k)]))
        idxs.append(proj.index(mem_dims(a), exprs))
    return proj, idxs, out_idx


# ----------------------------------------------------------------------------------------------
# The einsum notation


class Row:
    """A parsed row: items before the row variable, the variable (or None) and items after it.
    Without a row variable every item is in ``after`` (aligned from the right)."""

    def __init__(self, before, var, after):
        self.before, self.var, self.after = before, var, after

    def items(self):
        return self.before + self.after


LABEL_RE = r"[A-Za-z][A-Za-z0-9_]*"


def _parse_multi_token(tok, kind):
    if tok == "...":
        return ("var", ("...", kind))
    m = re.fullmatch(r"\.\.(" + LABEL_RE + r")\.\.", tok)
    if m:
        return ("var", ("..", m.group(1)))
    if tok.isdigit():
        return ("fixed", int(tok))
    if tok == "_":
        return ("anon",)
    if "^" in tok:
        parts = tok.split("^")
        if not all(re.fullmatch(LABEL_RE, p) for p in parts):
            raise DocError("spec", f"bad concatenation {tok!r}")
        return ("concat", parts)
    if "+" in tok or "*" in tok:
        m = re.fullmatch(r"(?:(\d+)\*)?(" + LABEL_RE + r")(?:\+(?:(\d+)\*)?(" + LABEL_RE + r"))?",
                         tok)
        if not m or (m.group(4) is None and m.group(1) is None):
            raise DocError("spec", f"bad convolution axis {tok!r}")
        stride = int(m.group(1) or 1)
        dil = int(m.group(3) or 1)
        return ("conv", stride, m.group(2), dil, m.group(4))
    if re.fullmatch(LABEL_RE, tok):
        return ("label", tok)
    raise DocError("spec", f"bad axis {tok!r}")


def _parse_row(text, kind, multi):
    toks = []
    if multi:
        pieces = text.split(",")
        if len(pieces) > 1 and any(not p.strip() for p in pieces):
            raise DocError("spec", f"empty axis in {text!r}")
        for p in pieces:
            toks.extend(_parse_multi_token(t, kind) for t in p.split())
    else:
        i = 0
        while i < len(text):
            c = text[i]
            if c.isspace():
                i += 1
            elif text.startswith("...", i):
                toks.append(("var", ("...", kind)))
                i += 3
            elif text.startswith("..", i):
                m = re.match(r"\.\.(" + LABEL_RE + r")\.\.", text[i:])
                if not m:
                    raise DocError("spec", f"bad row variable in {text!r}")
                toks.append(("var", ("..", m.group(1))))
                i += m.end()
            elif c.isdigit():
                j = i
                while j < len(text) and text[j].isdigit():
                    j += 1
                toks.append(("fixed", int(text[i:j])))
                i = j
            elif c.isalpha():
                toks.append(("label", c))
                i += 1
            elif c == "_":
                toks.append(("anon",))
                i += 1
            else:
                raise DocError("spec", f"unexpected {c!r} in {text!r}")
    vars_ = [k for k, t in enumerate(toks) if t[0] == "var"]
    if len(vars_) > 1:
        raise DocError("spec", f"two row variables in {text!r}")
    if vars_:
        k = vars_[0]
        return Row(toks[:k], toks[k][1], toks[k + 1:])
    return Row([], None, toks)


def parse_shape_spec(text, multi):
    if text.count("|") > 1 or text.count("->") > 1:
        raise DocError("spec", f"too many '|' or '->' in {text!r}")
    batch, rest = text.split("|") if "|" in text else ("", text)
    inp, out = rest.split("->") if "->" in rest else ("", rest)
    return {"batch": _parse_row(batch, "batch", multi), "input": _parse_row(inp, "input", multi),
            "output": _parse_row(out, "output", multi)}


def parse_spec(spec, n_args):
    if spec.count("=>") != 1:
        raise DocError("spec", f"a spec needs exactly one '=>': {spec!r}")
    lhs, rhs = spec.split("=>")
    multi = any(c in spec for c in ",*+^")
    operands = [parse_shape_spec(t, multi) for t in lhs.split(";")]
    result = parse_shape_spec(rhs, multi)
    if len(operands) != n_args:
        raise DocError("input", f"spec {spec!r} has {len(operands)} operands for {n_args} args")
    labels, rvars = set(), set()
    for s in operands + [result]:
        for r in s.values():
            for it in r.items():
                if it[0] == "label":
                    labels.add(it[1])
                elif it[0] == "conv":
                    labels.update(x for x in (it[2], it[4]) if x)
                elif it[0] == "concat":
                    labels.update(it[1])
            if r.var and r.var[0] == "..":
                rvars.add(r.var[1])
    if labels & rvars:
        raise DocError("spec", f"{sorted(labels & rvars)} used as label and row variable")
    return operands, result


def _align(row, n):
    """Pairs template items with argument axes: [(item, axis or None)] and the row variable's
    middle axes."""
    p, q = len(row.before), len(row.after)
    if row.var is None:
        if n > q:
            raise DocError("shape", f"an argument row of {n} axes against a pattern of {q}")
        return [(it, j - (q - n) if j >= q - n else None) for j, it in enumerate(row.after)], []
    if n >= p + q:
        pairs = [(it, j) for j, it in enumerate(row.before)]
        pairs += [(it, n - q + j) for j, it in enumerate(row.after)]
        return pairs, list(range(p, n - q))
    if p == 0:
        return [(it, j - (q - n) if j >= q - n else None) for j, it in enumerate(row.after)], []
    raise Unsupported("an argument with fewer axes than the axes around a row variable")


class EinsumPlan:
    """Label sizes, row-variable rows and the projection of one einsum-family operation."""

    def __init__(self, operands, result, arg_shapes, concat=False):
        self.operands, self.result, self.arg_shapes = operands, result, arg_shapes
        obs, conv_obs, rv_obs = {}, [], {}
        self.alignments = []
        for tmpl, sh in zip(operands, arg_shapes):
            al = {}
            for row in ROWS:
                pairs, mid = _align(tmpl[row], len(sh[row]))
                al[row] = (pairs, mid)
                for it, pos in pairs:
                    d = sh[row][pos] if pos is not None else None
                    if it[0] == "label":
                        obs.setdefault(it[1], []).append(d)
                    elif it[0] == "conv":
                        conv_obs.append((it, d))
                    elif it[0] == "fixed":
                        if d is not None and d != 1 and it[1] >= d:
                            raise DocError("shape", f"fixed index {it[1]} on an axis of {d}")
                        if d in (None, 1) and it[1] != 0:
                            raise Unsupported("a nonzero fixed index on a broadcast axis")
                    elif it[0] in ("anon", "concat"):
                        raise Unsupported(f"{it[0]} axis in an operand")
                if tmpl[row].var is not None:
                    rv_obs.setdefault(tmpl[row].var, []).append([sh[row][k] for k in mid])
            self.alignments.append(al)
        self.observed = set(obs)
        size, strong = {}, {}
        for lab, ds in obs.items():
            big = {d for d in ds if d is not None and d != 1}
            if len(big) > 1:
                raise DocError("shape", f"label {lab} has sizes {sorted(big)}")
            size[lab] = big.pop() if big else 1
            strong[lab] = size[lab] != 1
        for it, d in conv_obs:
            _, stride, o, dil, k = it
            if d is None or d == 1:
                raise Unsupported("a convolution axis against a broadcast axis")
            if k is None:
                if d % stride:
                    raise DocError("shape", f"{stride}*{o} cannot be {d}")
                osz = d // stride
            else:
                ksz = size.setdefault(k, 1)
                num = d - dil * (ksz - 1) - 1
                if num < 0 or num % stride:
                    raise DocError("shape", f"no whole {o} for a convolution over {d}")
                osz = num // stride + 1
            if strong.get(o) and size[o] != osz:
                raise DocError("shape", f"label {o}: {size[o]} vs {osz} from a convolution")
            size[o], strong[o] = osz, True
        rv = {var: broadcast_rows(rows, f"row variable {var}") for var, rows in rv_obs.items()}
        # Result-only labels and row variables close to 1 and to no axes.
        for r in ROWS:
            row = result[r]
            for it in row.items():
                if it[0] == "label":
                    size.setdefault(it[1], 1)
                elif it[0] == "concat":
                    for lab in it[1]:
                        size.setdefault(lab, 1)
                elif it[0] == "conv":
                    raise Unsupported("a convolution axis in the result")
            if row.var is not None:
                rv.setdefault(row.var, [])
        self.size, self.rv = size, rv
        # Iteration variables: labels, then row-variable axes.
        self.var_of = {}
        sizes = []
        for lab in sorted(size):
            self.var_of[("label", lab)] = len(sizes)
            sizes.append(size[lab])
        for var in sorted(rv, key=repr):
            for j, d in enumerate(rv[var]):
                self.var_of[("rv", var, j)] = len(sizes)
                sizes.append(d)
        self.proj = None if concat else Proj(sizes)
        self.iter_sizes = sizes
        rs = {}
        for r in ROWS:
            dims = []
            row = result[r]
            for part, items in (("b", row.before), ("a", row.after)):
                if part == "a" and row.var is not None:
                    dims.extend(rv[row.var])
                for it in items:
                    if it[0] == "label":
                        dims.append(size[it[1]])
                    elif it[0] == "fixed":
                        dims.append(it[1] + 1)
                    elif it[0] == "concat":
                        dims.append(sum(size[lab] for lab in it[1]))
                    else:
                        raise Unsupported(f"{it[0]} axis in the result")
            rs[r] = dims
        self.result_shape = make_shape(rs["batch"], rs["input"], rs["output"])

    def arg_exprs(self, k):
        """Index expressions of argument ``k``'s axes, in memory order."""
        sh, al = self.arg_shapes[k], self.alignments[k]
        exprs = []
        for row in ("batch", "output", "input"):
            pairs, mid = al[row]
            by_pos = {pos: it for it, pos in pairs if pos is not None}
            var = self.operands[k][row].var
            rvlen = len(self.rv.get(var, [])) if var is not None else 0
            for pos, d in enumerate(sh[row]):
                if pos in by_pos:
                    it = by_pos[pos]
                    if it[0] == "label":
                        big = self.size[it[1]] != 1
                        exprs.append((0, []) if d == 1 and big
                                     else (0, [(1, self.var_of[("label", it[1])])]))
                    elif it[0] == "fixed":
                        exprs.append((0, []) if d == 1 else (it[1], []))
                    elif it[0] == "conv":
                        _, stride, o, dil, kk = it
                        terms = [(stride, self.var_of[("label", o)])]
                        if kk is not None:
                            terms.append((dil, self.var_of[("label", kk)]))
                        exprs.append((0, terms))
                else:
                    j = mid.index(pos) + rvlen - len(mid)
                    big = self.rv[var][j] != 1
                    exprs.append((0, []) if d == 1 and big
                                 else (0, [(1, self.var_of[("rv", var, j)])]))
        return exprs

    def result_exprs(self, concat_part=None):
        """Index expressions of the result's axes; ``concat_part`` = (offset, label) writes a
        concatenation axis at that part."""
        exprs = []
        for r in ("batch", "output", "input"):
            row = self.result[r]
            for part, items in (("b", row.before), ("a", row.after)):
                if part == "a" and row.var is not None:
                    for j in range(len(self.rv[row.var])):
                        exprs.append((0, [(1, self.var_of[("rv", row.var, j)])]))
                for it in items:
                    if it[0] == "label":
                        exprs.append((0, [(1, self.var_of[("label", it[1])])]))
                    elif it[0] == "fixed":
                        exprs.append((it[1], []))
                    elif it[0] == "concat":
                        off, lab = concat_part
                        exprs.append((off, [(1, self.var_of[("label", lab)])]))
        return exprs


# ----------------------------------------------------------------------------------------------
# Documents

UNARY = {"neg", "relu", "exp", "log", "sqrt", "tanh", "sigmoid", "sin", "cos", "recip", "abs",
         "not"}
BINARY = {"add", "sub", "pointmul", "div", "pow", "max", "min", "lt", "eq", "ne"}
COMPARE = {"lt", "eq", "ne"}
ARITY = {**{o: 1 for o in UNARY}, **{o: 2 for o in BINARY}, "where": 3, "fma": 3, "matmul": 2,
         "transpose": 1, "einsum": 2, "einsum1": 1, "einmax1": 1, "tropical": 2,
         "batch_slice": 1}
LEAVES = {"number", "range", "range_of_shape", "ndarray", "param"}


class Node:
    """One tensor of the document: a leaf, a param (shared by name) or an operation."""

    def __init__(self, kind, js):
        self.kind = kind  # "leaf", "param" or the op name
        self.js = js
        self.args = []
        self.shape = None
        self.value = None
        self.grad = None
        self.needs_grad = False
        self.backward = None


def _dims(js, key):
    v = js.get(key, [])
    if not isinstance(v, list) or not all(isinstance(d, int) and d >= 0 for d in v):
        raise DocError("input", f"{key} must be a list of sizes")
    return v


def _numbers(vals, what):
    if not isinstance(vals, list):
        raise DocError("input", f"{what} must be a list")
    out = []
    for x in vals:
        if isinstance(x, bool) or not isinstance(x, (int, float, str)):
            raise DocError("input", f"{what}: {x!r} is not a number")
        if isinstance(x, str):
            if x not in ("inf", "-inf", "nan"):
                raise DocError("input", f"{what}: {x!r} is not a number")
            x = float(x)
        out.append(float(x))
    return out


class Evaluator:
    """Evaluates one document. ``param_values`` maps param names to flat values that replace
    their init (used for ``uniform`` params, whose values come from the tool, and for finite
    differences)."""

    def __init__(self, precision="f64", param_values=None, trace=False):
        self.precision = precision
        self.ar = Arith(precision, trace)
        self.param_values = param_values or {}
        self.named = {}
        self.open_names = set()
        self.params = {}
        self.order = []
        self.by_js = {}  # id of an expression's JSON object -> its node

    def leaf_values(self, xs):
        a = np.asarray(xs, dtype=float)
        return a.astype(np.float32).astype(float) if self.precision == "f32" else a

    # -- construction and forward evaluation (document order: left to right, depth first)

    def build(self, js):
        node = self._build(js)
        self.by_js[id(js)] = node
        return node

    def _build(self, js):
        if not isinstance(js, dict):
            raise DocError("input", "an expression must be an object")
        if "ref" in js:
            name = js["ref"]
            if name in self.params and name not in self.named:
                raise DocError("input", f"ref to param {name}")
            if name not in self.named:
                raise DocError("input", f"ref to unknown or incomplete node {name!r}")
            return self.named[name]
        name = js.get("name")
        if "leaf" in js and js["leaf"] == "param":
            return self.build_param(js)
        if name is not None:
            if not isinstance(name, str):
                raise DocError("input", "a name must be a string")
            if name in self.named or name in self.open_names or name in self.params:
                raise DocError("input", f"duplicate name {name!r}")
            self.open_names.add(name)
        if "leaf" in js:
            node = self.build_leaf(js)
        elif "op" in js:
            node = self.build_op(js)
        else:
            raise DocError("input", "an expression needs 'leaf', 'op' or 'ref'")
        if name is not None:
            self.open_names.discard(name)
            self.named[name] = node
        return node

    def build_leaf(self, js):
        kind = js["leaf"]
        node = Node("leaf", js)
        if kind == "number":
            if "value" not in js:
                raise DocError("input", "number needs a value")
            node.shape = make_shape()
            node.value = EV(self.leaf_values(_numbers([js["value"]], "value")).reshape(()))
        elif kind == "range":
            n = js.get("n")
            if not isinstance(n, int) or n < 0:
                raise DocError("input", "range needs n")
            node.shape = make_shape(output=[n])
            node.value = EV(np.arange(n, dtype=float))
        elif kind in ("range_of_shape", "ndarray"):
            node.shape = make_shape(_dims(js, "batch"), _dims(js, "input"), _dims(js, "output"))
            dims = mem_dims(node.shape)
            count = int(np.prod(dims)) if dims else 1
            if kind == "range_of_shape":
                vals = np.arange(count, dtype=float)
            else:
                if "values" not in js:
                    raise DocError("input", "ndarray needs values")
                vals = self.leaf_values(_numbers(js["values"], "values"))
                if vals.size != count:
                    raise DocError("input", f"{vals.size} values for {count} cells")
            node.value = EV(vals.reshape(dims))
        else:
            raise DocError("input", f"unknown leaf {kind!r}")
        self.order.append(node)
        return node

    def build_param(self, js):
        name = js.get("name")
        if not isinstance(name, str):
            raise DocError("input", "a param needs a name")
        if name in self.named or name in self.open_names:
            raise DocError("input", f"param {name!r} clashes with a node name")
        rows = {r: _dims(js, r) for r in ROWS if r in js}
        init = js.get("init")
        if name in self.params:
            node = self.params[name]
            for r, d in rows.items():
                if node.js_rows.get(r) != d:
                    raise DocError("input", f"param {name}: {r} row differs from its first use")
            if init is not None and init != node.js_init:
                raise DocError("input", f"param {name}: init differs from its first use")
            return node
        node = Node("param", js)
        node.name = name
        node.js_rows = rows
        node.js_init = init
        node.needs_grad = True
        self.params[name] = node
        if "input" in rows and "output" in rows:
            node.shape = make_shape(rows.get("batch", []), rows["input"], rows["output"])
            self.init_param(node)
        return node

    def init_param(self, node):
        dims = mem_dims(node.shape)
        count = int(np.prod(dims)) if dims else 1
        init = node.js_init if node.js_init is not None else {"constant": 0}
        amb = np.zeros(dims, dtype=bool)
        if node.name in self.param_values:
            vals = self.leaf_values(self.param_values[node.name])
            if vals.size != count:
                raise DocError("input", f"param {node.name}: {vals.size} values for {count}")
        elif not isinstance(init, dict):
            raise DocError("input", f"param {node.name}: bad init")
        elif "constant" in init:
            vals = self.leaf_values(np.full(count, _numbers([init["constant"]], "constant")[0]))
        elif "values" in init:
            vals = self.leaf_values(_numbers(init["values"], "init values"))
            if vals.size != count:
                raise DocError("input", f"param {node.name}: {vals.size} values for {count}")
        elif "uniform" in init:
            lo, hi = _numbers(init["uniform"], "uniform")
            vals = np.full(count, (lo + hi) / 2)  # unknown: the tool's generator decides
            amb = np.ones(dims, dtype=bool)
        else:
            raise DocError("input", f"param {node.name}: unknown init {init}")
        node.value = EV(vals.reshape(dims), None, amb)
        self.order.append(node)

    def build_op(self, js):
        op = js["op"]
        if op not in ARITY and op != "concat":
            raise DocError("input", f"unknown op {op!r}")
        args_js = js.get("args")
        if not isinstance(args_js, list):
            raise DocError("input", f"{op} needs args")
        if op != "concat" and len(args_js) != ARITY[op]:
            raise DocError("input", f"{op} takes {ARITY[op]} args, not {len(args_js)}")
        if op == "concat" and not args_js:
            raise DocError("input", "concat needs args")
        node = Node(op, js)
        node.args = [self.build(a) for a in args_js]
        if op in ("einsum", "einsum1", "einmax1", "tropical", "concat"):
            if not isinstance(js.get("spec"), str):
                raise DocError("input", f"{op} needs a spec")
            node.spec = parse_spec(js["spec"], len(node.args))
        self._resolve_params(node)
        node.needs_grad = any(a.needs_grad for a in node.args) and op not in COMPARE | {"not"}
        (getattr(self, "op_" + op, None) or self.op_pointwise)(node)
        self.order.append(node)
        return node

    # -- inference of omitted param rows from the other arguments of the param's first op

    def _resolve_params(self, node):
        pending = [k for k, a in enumerate(node.args) if a.kind == "param" and a.shape is None]
        if not pending:
            return
        if len({id(node.args[k]) for k in pending}) != len(pending) or len(pending) > 1:
            raise Unsupported(f"{node.kind} with two shape-less params")
        k = pending[0]
        p = node.args[k]
        given = p.js_rows
        others = [a for j, a in enumerate(node.args) if j != k]
        op = node.kind
        rows = {}
        if op in BINARY or op == "where" or (op == "fma" and k == 2):
            if op == "fma":
                m = self._matmul_shape(node.args[0].shape, node.args[1].shape)
                ctx = [m]
            else:
                ctx = [a.shape for a in others]
            for r in ("input", "output"):
                rows[r] = broadcast_rows([s[r] for s in ctx], op)
        elif op in ("matmul", "fma") and k == 0:
            rows["input"] = list(node.args[1].shape["output"])
        elif op in ("matmul", "fma") and k == 1:
            rows["output"] = list(node.args[0].shape["input"])
        elif op in ("einsum", "tropical"):
            rows = self._rows_from_spec(node, k)
        else:
            raise Unsupported(f"a shape-less param as an argument of {op}")
        shape = {}
        for r in ROWS:
            if r in given:
                shape[r] = given[r]
            elif r == "batch":
                shape[r] = []
            elif r in rows:
                shape[r] = rows[r]
            else:
                raise Unsupported(f"param {p.name}: {r} row not determined by {op}")
        p.shape = make_shape(shape["batch"], shape["input"], shape["output"])
        self.init_param(p)

    def _rows_from_spec(self, node, k):
        operands, _ = node.spec
        others = [(operands[j], a.shape) for j, a in enumerate(node.args) if j != k]
        plan = EinsumPlan([o for o, _ in others], node.spec[1], [s for _, s in others])
        rows = {}
        for r in ("input", "output"):
            row = operands[k][r]
            dims = []
            for part, items in (("b", row.before), ("a", row.after)):
                if part == "a" and row.var is not None:
                    if row.var not in plan.rv:
                        raise Unsupported("a param's row variable bound by nothing else")
                    dims.extend(plan.rv[row.var])
                for it in items:
                    if it[0] != "label" or it[1] not in plan.observed:
                        raise Unsupported("a param axis the other operands do not size")
                    dims.append(plan.size[it[1]])
            rows[r] = dims
        return rows

    # -- operations

    def _attach(self, node, value, backward):
        node.value = value
        node.backward = backward if node.needs_grad else None

    def op_pointwise(self, node):
        op, ar = node.kind, self.ar
        shapes = [a.shape for a in node.args]
        result = make_shape(*(broadcast_rows([s[r] for s in shapes], op) for r in ROWS))
        node.shape = result
        proj, idxs, out_idx = pointwise_proj(result, shapes)
        xs = [gather(a.value, i) for a, i in zip(node.args, idxs)]
        rdims = mem_dims(result)
        n_cells = proj.count
        if op in UNARY:
            x = xs[0]
            if op == "neg":
                y = ar.neg(x)
            elif op == "relu":
                y = ar.relu(x)
            elif op == "abs":
                y = ar.abs(x)
            elif op == "not":
                y = ar.logical_not(x)
            else:
                y = ar.unary(op, x)
        elif op in COMPARE:
            y = ar.compare(op, xs[0], xs[1])
        elif op == "where":
            y = ar.where(*xs)
        else:
            a, b = xs
            y = {"add": lambda: ar.add(a, b), "sub": lambda: ar.sub(a, b),
                 "pointmul": lambda: ar.mul(a, b), "div": lambda: ar.div(a, b),
                 "pow": lambda: ar.pow(a, b), "max": lambda: ar.maxmin(a, b, True),
                 "min": lambda: ar.maxmin(a, b, False)}[op]()

        def backward(g):
            gt = gather(g, out_idx)
            one = EV.const(1.0, n_cells)
            contribs = []
            if op in UNARY:
                x = xs[0]
                if op == "neg":
                    d = [ar.neg(gt)]
                elif op in ("relu", "abs"):
                    kink = (x.v == 0) | (ar.close(x.v, x.e, np.zeros_like(x.e)) & (x.e > 0))
                    slope = (x.v > 0).astype(float) if op == "relu" else np.sign(x.v)
                    d = [ar.mul(gt, EV(slope, None, kink | x.amb))]
                elif op == "exp":
                    d = [ar.mul(gt, y)]
                elif op == "log":
                    d = [ar.div(gt, x)]
                elif op == "sqrt":
                    d = [ar.div(gt, ar.mul(EV.const(2.0, n_cells), y))]
                elif op == "tanh":
                    d = [ar.mul(gt, ar.sub(one, ar.mul(y, y)))]
                elif op == "sigmoid":
                    d = [ar.mul(gt, ar.mul(y, ar.sub(one, y)))]
                elif op == "sin":
                    d = [ar.mul(gt, ar.unary("cos", x))]
                elif op == "cos":
                    d = [ar.neg(ar.mul(gt, ar.unary("sin", x)))]
                elif op == "recip":
                    d = [ar.neg(ar.mul(gt, ar.mul(y, y)))]
                else:
                    d = [None]
            elif op in COMPARE:
                d = [None, None]
            elif op == "where":
                c = xs[0]
                take = c.v != 0
                c_amb = c.amb | ((np.abs(c.v) <= SAFETY * c.e * ar.u) & (c.e > 0))
                d = [None, ar.mul(gt, EV(take.astype(float), None, c_amb)),
                     ar.mul(gt, EV((~take).astype(float), None, c_amb))]
            else:
                a, b = xs
                if op == "add":
                    d = [gt, gt]
                elif op == "sub":
                    d = [gt, ar.neg(gt)]
                elif op == "pointmul":
                    d = [ar.mul(gt, b), ar.mul(gt, a)]
                elif op == "div":
                    d = [ar.div(gt, b), ar.neg(ar.div(ar.mul(gt, y), b))]
                elif op == "pow":
                    da = ar.mul(b, ar.pow(a, ar.sub(b, one))) if node.args[0].needs_grad else None
                    db = ar.mul(y, ar.unary("log", a)) if node.args[1].needs_grad else None
                    # x^0 is constant in x, and 0^y (y >= 0) constant in y: 0, not 0·inf.
                    if da is not None:
                        da = zero_where(da, b.v == 0)
                    if db is not None:
                        db = zero_where(db, (a.v == 0) & (b.v >= 0))
                    d = [ar.mul(gt, da) if da is not None else None,
                         ar.mul(gt, db) if db is not None else None]
                else:  # max, min: ties split the gradient evenly
                    diff = a.v - b.v
                    first = (diff > 0) if op == "max" else (diff < 0)
                    tie = diff == 0
                    exact_tie = tie & (a.e == 0) & (b.e == 0)
                    unsure = (ar.close(diff, a.e, b.e) & ~exact_tie) | a.amb | b.amb
                    wa = np.where(first, 1.0, np.where(tie, 0.5, 0.0))
                    d = [ar.mul(gt, EV(wa, None, unsure)), ar.mul(gt, EV(1.0 - wa, None, unsure))]
            for arg, idx, dk in zip(node.args, idxs, d):
                if dk is not None and arg.needs_grad:
                    cells = int(np.prod(mem_dims(arg.shape)))
                    contribs.append((arg, ar.scatter_sum(dk, idx, cells)))
            return contribs

        self._attach(node, y.reshape(rdims), backward)

    @staticmethod
    def _matmul_shape(a, b):
        ia, ob = a["input"], b["output"]
        if len(ob) > len(ia) or any(d != 1 and d != ia[len(ia) - len(ob) + j]
                                    for j, d in enumerate(ob)):
            raise DocError("shape", f"compose: input {ia} of the first argument against output "
                           f"{ob} of the second")
        return make_shape(broadcast_rows([a["batch"], b["batch"]], "matmul batch"),
                          b["input"], a["output"])

    def _matmul(self, a_node, b_node, addend=None):
        """Returns the result shape and value of a * b (+ addend, accumulated into the same sum:
        fma may start its sum from the addend), and a backward function."""
        a, b = a_node.shape, b_node.shape
        res = self._matmul_shape(a, b)
        nb, no, ni, nk = len(res["batch"]), len(res["output"]), len(res["input"]), len(a["input"])
        sizes = res["batch"] + res["output"] + res["input"] + a["input"]
        proj = Proj(sizes)
        vb = lambda j: j  # noqa: E731
        vo = lambda j: nb + j  # noqa: E731
        vi = lambda j: nb + no + j  # noqa: E731
        vk = lambda j: nb + no + ni + j  # noqa: E731

        def batch_exprs(s):
            out = []
            for j, d in enumerate(s["batch"]):
                k = nb - len(s["batch"]) + j
                out.append((0, []) if d == 1 and res["batch"][k] != 1 else (0, [(1, vb(k))]))
            return out

        ea = batch_exprs(a) + [(0, [(1, vo(j))]) for j in range(no)] + \
            [(0, [(1, vk(j))]) for j in range(nk)]
        eb = batch_exprs(b)
        for j, d in enumerate(b["output"]):
            k = nk - len(b["output"]) + j
            eb.append((0, []) if d == 1 and a["input"][k] != 1 else (0, [(1, vk(k))]))
        eb += [(0, [(1, vi(j))]) for j in range(ni)]
        er = [(0, [(1, vb(j))]) for j in range(nb)] + [(0, [(1, vo(j))]) for j in range(no)] + \
            [(0, [(1, vi(j))]) for j in range(ni)]
        ia, ib, ir = proj.index(mem_dims(a), ea), proj.index(mem_dims(b), eb), \
            proj.index(mem_dims(res), er)
        extra = None
        if addend is not None:
            c = addend.shape
            if any(broadcast_rows([res[r], c[r]], "fma") != res[r] for r in ROWS):
                raise Unsupported("an fma addend larger than the product")
            _, (ic,), oc = pointwise_proj(res, [c])
            extra = (addend, ic, oc)
        return res, self._contract(proj.count, [a_node, b_node], [ia, ib], ir, mem_dims(res),
                                   "mul", "sum", extra)

    def _contract(self, count, args, idxs, out_idx, rdims, combine, reduce, extra=None):
        """Gather the arguments over the iteration space, combine (product, sum or identity),
        reduce into the result (sum or max). ``extra`` = (node, its index, result index) adds
        that node's cells to the sums. Returns the value and a backward function."""
        ar = self.ar
        xs = [gather(a.value, i) for a, i in zip(args, idxs)]
        if combine == "mul":
            terms = xs[0]
            for x in xs[1:]:
                terms = ar.mul(terms, x)
        elif combine == "add":
            terms = xs[0]
            for x in xs[1:]:
                terms = ar.add(terms, x)
        else:
            terms = xs[0]
        size = int(np.prod(rdims)) if rdims else 1
        if reduce == "sum":
            flat = out_idx
            if extra is not None:
                ct = gather(extra[0].value, extra[1])
                terms = EV(np.concatenate([terms.v, ct.v]), np.concatenate([terms.e, ct.e]),
                           np.concatenate([terms.amb, ct.amb]))
                flat = np.concatenate([out_idx, extra[2]])
            value = ar.scatter_sum(terms, flat, size)
            weight = route_amb = None
        else:
            value, weight, route_amb = ar.scatter_max(terms, out_idx, size)

        def backward(g):
            gt = gather(g, out_idx)
            if reduce == "max":
                gt = EV(gt.v * weight, gt.e * weight, (gt.amb & (weight > 0)) | route_amb)
            contribs = []
            for k, (a, idx) in enumerate(zip(args, idxs)):
                if not a.needs_grad:
                    continue
                local = gt
                if combine == "mul":
                    for j, x in enumerate(xs):
                        if j != k:
                            local = ar.mul(local, x)
                contribs.append((a, ar.scatter_sum(local, idx, int(np.prod(mem_dims(a.shape))))))
            if extra is not None and extra[0].needs_grad:
                cn, ic, oc = extra
                contribs.append((cn, ar.scatter_sum(gather(g, oc), ic,
                                                    int(np.prod(mem_dims(cn.shape))))))
            return contribs

        return value.reshape(rdims), backward

    def op_matmul(self, node):
        node.shape, (value, bw) = self._matmul(node.args[0], node.args[1])
        self._attach(node, value, bw)

    def op_fma(self, node):
        a, b, c = node.args
        node.shape, (value, bw) = self._matmul(a, b, addend=c)
        self._attach(node, value, bw)

    def op_transpose(self, node):
        s = node.args[0].shape
        res = make_shape(s["batch"], s["output"], s["input"])
        node.shape = res
        nb, no, ni = len(res["batch"]), len(res["output"]), len(res["input"])
        proj = Proj(mem_dims(res))
        # The argument's output row is the result's input row and vice versa.
        ea = [(0, [(1, j)]) for j in range(nb)] + [(0, [(1, nb + no + j)]) for j in range(ni)] + \
            [(0, [(1, nb + j)]) for j in range(no)]
        ia = proj.index(mem_dims(s), ea)
        ir = proj.index(mem_dims(res), [(0, [(1, j)]) for j in range(nb + no + ni)])
        value, bw = self._contract(proj.count, node.args, [ia], ir, mem_dims(res), "id", "sum")
        self._attach(node, value, bw)

    def op_batch_slice(self, node):
        s = node.args[0].shape
        i = node.js.get("index")
        if not isinstance(i, int) or isinstance(i, bool):
            raise DocError("input", "batch_slice needs an integer index")
        if not s["batch"]:
            raise DocError("shape", "batch_slice of a tensor without batch axes")
        if not 0 <= i < s["batch"][0]:
            raise DocError("shape", f"batch index {i} out of range {s['batch'][0]}")
        res = make_shape(s["batch"][1:], s["input"], s["output"])
        node.shape = res
        rd = mem_dims(res)
        proj = Proj(rd)
        ia = proj.index(mem_dims(s), [(i, [])] + [(0, [(1, j)]) for j in range(len(rd))])
        ir = proj.index(rd, [(0, [(1, j)]) for j in range(len(rd))])
        value, bw = self._contract(proj.count, node.args, [ia], ir, rd, "id", "sum")
        self._attach(node, value, bw)

    def _einsum_family(self, node, combine, reduce):
        operands, result = node.spec
        plan = EinsumPlan(operands, result, [a.shape for a in node.args])
        for r in ROWS:
            if any(it[0] == "concat" for it in result[r].items()):
                raise Unsupported("concatenation in an einsum result")
        node.shape = plan.result_shape
        rd = mem_dims(node.shape)
        idxs = [plan.proj.index(mem_dims(a.shape), plan.arg_exprs(k))
                for k, a in enumerate(node.args)]
        ir = plan.proj.index(rd, plan.result_exprs())
        value, bw = self._contract(plan.proj.count, node.args, idxs, ir, rd, combine, reduce)
        self._attach(node, value, bw)

    def op_einsum(self, node):
        self._einsum_family(node, "mul", "sum")

    def op_einsum1(self, node):
        self._einsum_family(node, "id", "sum")

    def op_einmax1(self, node):
        self._einsum_family(node, "id", "max")

    def op_tropical(self, node):
        self._einsum_family(node, "add", "max")

    def op_concat(self, node):
        operands, result = node.spec
        cat = [(r, it) for r in ROWS for it in result[r].items() if it[0] == "concat"]
        if len(cat) != 1:
            raise Unsupported("concat needs exactly one '^' axis in its result")
        parts = cat[0][1][1]
        shapes = [a.shape for a in node.args]
        plan = EinsumPlan(operands, result, shapes, concat=True)
        node.shape = plan.result_shape
        rd = mem_dims(node.shape)
        # Each part is written by the first argument not yet placed whose pattern has its label.
        owner, used = [], set()
        for lab in parts:
            k = next((k for k, o in enumerate(operands) if k not in used and any(
                it == ("label", lab) for r in ROWS for it in o[r].items())), None)
            if k is None:
                raise Unsupported(f"no argument for concatenation part {lab}")
            used.add(k)
            owner.append(k)
        if len(used) != len(operands):
            raise Unsupported("an argument of concat fills no part")
        total = None
        backwards = []
        off = 0
        for j, lab in enumerate(parts):
            k = owner[j]
            # Iterate over this part only: the other parts' labels take one position.
            sizes = list(plan.iter_sizes)
            for other in set(parts) - {lab}:
                sizes[plan.var_of[("label", other)]] = 1
            proj = Proj(sizes)
            ia = proj.index(mem_dims(shapes[k]), plan.arg_exprs(k))
            ir = proj.index(rd, plan.result_exprs((off, lab)))
            off += plan.size[lab]
            val, bw = self._contract(proj.count, [node.args[k]], [ia], ir, rd, "id", "sum")
            # Parts do not overlap: summing the parts (zeros elsewhere) is exact placement.
            total = val if total is None else EV(total.v + val.v, total.e + val.e,
                                                 total.amb | val.amb)
            backwards.append(bw)

        def backward(g):
            out = []
            for bw in backwards:
                out.extend(bw(g))
            return out

        self._attach(node, total, backward)

    # -- backpropagation

    def backprop(self, root):
        ar = self.ar
        for n in self.order:
            n.grad = None
        dims = mem_dims(root.shape)
        root.grad = EV(np.ones(int(np.prod(dims)) if dims else 1))
        for n in reversed(self.order):
            if n.grad is None or n.backward is None:
                continue
            g = n.grad.reshape(-1)
            for arg, ga in n.backward(g):
                ga = ga.reshape(mem_dims(arg.shape))
                arg.grad = ga if arg.grad is None else ar.add(arg.grad, ga)


def evaluate(doc, precision="f64", param_values=None, trace=False):
    """Evaluates a document: returns a dict with the root's ``shape`` and ``values`` (EV, flat),
    ``nodes`` and ``params`` as the tool reports them, plus ``trace`` (the discrete decisions)
    when asked. Raises ``DocError`` for an invalid document, ``Unsupported`` beyond its reach."""
    if not isinstance(doc, dict) or "expr" not in doc:
        raise DocError("input", "a document needs 'expr'")
    ev = Evaluator(precision, param_values, trace)
    with np.errstate(all="ignore"):
        root = ev.build(doc["expr"])
        if root.kind == "param" and root.shape is None:
            raise Unsupported("a shape-less param as the whole expression")
        for name, p in ev.params.items():
            if p.shape is None:
                raise Unsupported(f"param {name} never resolved")
        grad = bool(doc.get("grad", False))
        if grad:
            ev.backprop(root)

    def flat(x):
        return EV(x.v.reshape(-1), x.e.reshape(-1), x.amb.reshape(-1))

    out = {"shape": root.shape, "values": flat(root.value),
           "nodes": {k: {"shape": n.shape, "values": flat(n.value)} for k, n in ev.named.items()},
           "params": {}}
    for name, p in ev.params.items():
        entry = {"shape": p.shape, "values": flat(p.value)}
        if grad:
            g = p.grad if p.grad is not None else EV(np.zeros(p.value.v.shape))
            entry["grad"] = flat(g)
        out["params"][name] = entry
    if trace:
        out["trace"] = ev.ar.trace
    out["by_js"] = {k: (n.shape, flat(n.value)) for k, n in ev.by_js.items()}
    return out


def root_sum(doc, param_values, precision="f64"):
    """The sum of the root's cells and the decisions taken, for finite differences."""
    r = evaluate(doc, precision, param_values, trace=True)
    return float(np.sum(r["values"].v)), r["trace"]


if __name__ == "__main__":
    import json
    import sys

    d = json.load(open(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "-" else sys.stdin)
    res = evaluate(d, sys.argv[2] if len(sys.argv) > 2 else "f64")

    def show(ev):
        return [None if a else float(v) for v, a in zip(ev.v, ev.amb)]

    print(json.dumps({
        "shape": res["shape"], "values": show(res["values"]),
        "nodes": {k: {"shape": n["shape"], "values": show(n["values"])}
                  for k, n in res["nodes"].items()},
        "params": {k: {kk: (show(vv) if isinstance(vv, EV) else vv) for kk, vv in p.items()}
                   for k, p in res["params"].items()}}))
