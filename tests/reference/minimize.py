"""Shrinks a document while a mismatch with the reference persists.

Why this file exists: a random document that exposes a defect usually holds a dozen operations
that have nothing to do with it. Greedy reduction — replace a subexpression by a constant holding
its values, hoist an argument of the same shape into its parent's place, drop names, gradients and
random inits — turns it into a document a person can read, while re-running the tool and the
reference after every step to check that the same kind of mismatch is still there.
"""

import copy
import json
import re

import compare
import reference


def walk(expr, path=()):
    """Yields (path, expression) in document order; a path is a tuple of argument positions."""
    yield path, expr
    if isinstance(expr, dict) and isinstance(expr.get("args"), list):
        for k, a in enumerate(expr["args"]):
            yield from walk(a, path + (k,))


def get(doc, path):
    e = doc["expr"]
    for k in path:
        e = e["args"][k]
    return e


def put(doc, path, new):
    if not path:
        doc["expr"] = new
        return
    get(doc, path[:-1])["args"][path[-1]] = new


def size(expr):
    return sum(1 for _ in walk(expr))


def constant(shape, ev, precision):
    """An ndarray leaf holding ``ev``'s values, or None when some are not finite or unsure."""
    vals = []
    for v, a in zip(ev.v, ev.amb):
        if a or v != v or v in (float("inf"), float("-inf")):
            return None
        # Few digits: long decimals would also test the tool's number parsing.
        vals.append(float(f"{v:.{9 if precision == 'f32' else 15}g}"))
    js = {"leaf": "ndarray", "values": vals}
    for r in reference.ROWS:
        if shape[r]:
            js[r] = list(shape[r])
    return js


def error_signature(error):
    """An error's kind and the first words of its message without numbers and variables, so
    that a reduction keeps the same complaint rather than any error of the same kind."""
    if not isinstance(error, dict):
        return None
    words = re.sub(r"[$]?\w*\d\w*", "", str(error.get("message", ""))).split()[:6]
    return (error.get("kind"), " ".join(words))


def normalize(doc, definitions):
    """After a reduction: the first occurrence of every param carries its full definition and
    later ones only its name; a ``ref`` whose node is gone becomes that node's constant (which
    takes over the name)."""
    seen_params, named = set(), set()
    lost = {}

    def fix(e):
        if not isinstance(e, dict):
            return e
        if e.get("leaf") == "param":
            name = e.get("name")
            if name in seen_params:
                return {"leaf": "param", "name": name}
            seen_params.add(name)
            return copy.deepcopy(definitions.get(name, e))
        if "ref" in e:
            if e["ref"] in named:
                return e
            if e["ref"] in definitions.get("#nodes", {}):
                c = copy.deepcopy(definitions["#nodes"][e["ref"]])
                if c is None:
                    lost["ref"] = True
                    return e
                c["name"] = e["ref"]
                named.add(e["ref"])
                return c
            return e
        out = dict(e)
        if isinstance(e.get("args"), list):
            out["args"] = [fix(a) for a in e["args"]]
        if "name" in out:
            named.add(out["name"])
        return out

    new = dict(doc)
    new["expr"] = fix(doc["expr"])
    return None if lost else new


class Minimizer:
    """Greedy reduction of ``doc`` for one backend and precision, keeping ``category``."""

    def __init__(self, binary, backend, precision, category, env=None, max_runs=250,
                 error=None):
        self.binary, self.backend, self.precision = binary, backend, precision
        self.category, self.env, self.max_runs = category, env, max_runs
        # For "rejected": the error that must persist (its kind and the gist of its message).
        self.error = error_signature(error) if error else None
        self.runs = 0

    def outcome(self, doc):
        self.runs += 1
        ans = compare.run_tool(self.binary, doc, "eval", self.backend, self.precision, self.env)
        return compare.compare(doc, ans, self.precision), ans

    def still_fails(self, doc):
        try:
            reference.evaluate(doc, self.precision)
        except (reference.DocError, reference.Unsupported):
            return False
        res, ans = self.outcome(doc)
        if res.category != self.category:
            return False
        return self.error is None or error_signature(ans.error) == self.error

    def definitions(self, doc, ref):
        """Every param's first (full) occurrence, and every named node's constant."""
        defs = {"#nodes": {}}
        for _, e in walk(doc["expr"]):
            if isinstance(e, dict) and e.get("leaf") == "param" and e.get("name") not in defs:
                defs[e["name"]] = copy.deepcopy(e)
        for name, n in ref["nodes"].items():
            defs["#nodes"][name] = constant(n["shape"], n["values"], self.precision)
        return defs

    def candidates(self, doc, ref):
        """Reduced documents, most reducing first."""
        nodes = list(walk(doc["expr"]))
        by_js = ref["by_js"]
        out = []
        for path, e in sorted(nodes, key=lambda pe: -size(pe[1])):
            if not isinstance(e, dict):
                continue
            info = by_js.get(id(e))
            if "op" in e and info is not None:
                c = constant(info[0], info[1], self.precision)
                if c is not None:
                    if "name" in e:
                        c["name"] = e["name"]
                    out.append(("constant", path, c))
                for k, a in enumerate(e["args"]):
                    ainfo = by_js.get(id(a))
                    if ainfo is not None and ainfo[0] == info[0]:
                        h = copy.deepcopy(a)
                        if "name" in e and "name" not in h and "ref" not in h \
                                and h.get("leaf") != "param":
                            h["name"] = e["name"]
                        out.append(("hoist", path, h))
            if e.get("leaf") == "param" and info is not None and len(path) > 0:
                c = constant(info[0], info[1], self.precision)
                if c is not None:
                    out.append(("param to constant", path, c))
            if "ref" in e and info is not None:
                c = constant(info[0], info[1], self.precision)
                if c is not None:
                    out.append(("inline ref", path, c))
        for path, e in nodes:
            if isinstance(e, dict) and "name" in e and e.get("leaf") != "param":
                h = dict(e)
                del h["name"]
                out.append(("drop name", path, h))
        return out

    def run(self, doc, tool_answer=None):
        """The smallest document found that still shows the mismatch."""
        doc = copy.deepcopy(doc)
        # Make it self-contained: uniform inits become the values the tool drew.
        if tool_answer is not None:
            pv = compare.uniform_values(doc, tool_answer)
            for _, e in walk(doc["expr"]):
                if isinstance(e, dict) and e.get("name") in pv and e.get("leaf") == "param" \
                        and "init" in e:
                    e["init"] = {"values": [compare.tool_number(x, "f64") for x in pv[e["name"]]]}
            if pv and not self.still_fails(doc):
                return doc
        if doc.get("grad") and self.category != "grad":
            d = dict(doc, grad=False)
            if self.still_fails(d):
                doc = d
        progress = True
        while progress and self.runs < self.max_runs:
            progress = False
            try:
                ref = reference.evaluate(doc, self.precision)
            except (reference.DocError, reference.Unsupported):
                break
            defs = self.definitions(doc, ref)
            for _, path, new in self.candidates(doc, ref):
                if self.runs >= self.max_runs:
                    break
                cand = copy.deepcopy(doc)
                put(cand, path, copy.deepcopy(new))
                cand = normalize(cand, defs)
                if cand is None or json.dumps(cand) == json.dumps(doc):
                    continue
                if self.still_fails(cand):
                    doc = cand
                    progress = True
                    break
        return doc
