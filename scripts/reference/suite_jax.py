"""The JAX side of the model suite (docs/benchmarks.md, "The model suite"): every model of
benches/suite/models.json, written as a JAX user writes it (plain `jax.numpy` functions over
parameter pytrees, the whole training step under `jax.jit`), trained on random batches of the
configured shapes, timed step by step.

    python3 scripts/reference/suite_jax.py --list
    python3 scripts/reference/suite_jax.py --model gpt-w128-l4-c64 [--steps N] [--warmup W]

Each model follows scripts/reference/suite.py: the same architecture, the same init
distributions (GPT-2's N(0, 0.02) with zero biases for the GPTs, PyTorch's default
`nn.Linear`/`nn.Conv2d`/`nn.Embedding` init elsewhere), the same optimizers with PyTorch's
update rules (AdamW with clipping by the global gradient norm, Adam, SGD), the same losses and
batches of the same shapes and distributions. The values differ: JAX draws its own (from
`jax.random.key(0)`).

Prints one JSON object: the model, `step_s` (the median of the timed steps' wall times, each
waited for with `block_until_ready`), `steps_per_s` (its inverse), `compile_s` (from the start
of the process, imports included, until the jitted training step is compiled: runnable),
`first_step_s` (from the start of the process to the end of the first step), `loss` (the last
step's) and `params`, as scripts/reference/suite.py and examples/suite.rs do.
"""

import argparse
import json
import math
import os
import statistics
import time

T0 = time.perf_counter()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "..", "benches", "suite", "models.json")


# Parameters: nested dicts of arrays; a linear layer is {"w": (in, out), "b": (out,)}.


def linear_init(key, fan_in, fan_out, bias=True):
    """PyTorch's default `nn.Linear` init: weight and bias uniform in ±1/sqrt(fan_in)."""
    kw, kb = jax.random.split(key)
    bound = 1.0 / math.sqrt(fan_in)
    p = {"w": jax.random.uniform(kw, (fan_in, fan_out), minval=-bound, maxval=bound)}
    if bias:
        p["b"] = jax.random.uniform(kb, (fan_out,), minval=-bound, maxval=bound)
    return p


def normal_linear_init(key, fan_in, fan_out, bias, std=0.02):
    """GPT-2's init: weight N(0, std), bias zero."""
    p = {"w": std * jax.random.normal(key, (fan_in, fan_out))}
    if bias:
        p["b"] = jnp.zeros((fan_out,))
    return p


def linear(p, x):
    y = x @ p["w"]
    return y + p["b"] if "b" in p else y


def layer_norm_init(width, bias):
    p = {"w": jnp.ones((width,))}
    if bias:
        p["b"] = jnp.zeros((width,))
    return p


def layer_norm(p, x, eps):
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + eps) * p["w"]
    return y + p["b"] if "b" in p else y


def cross_entropy(logits, labels):
    """The mean over all positions of -log softmax(logits)[label]."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, labels[..., None], axis=-1).mean()


def mse(pred, target):
    return jnp.square(pred - target).mean()


# The models: `init(key) -> params` and `apply(params, x) -> output`.


def gpt(c, t):
    """A pre-LayerNorm GPT: causal self-attention and a GELU MLP per block, each residual."""
    w, v, ctx, heads, bias = c["width"], c["vocab"], c["context"], c["heads"], c["bias"]
    ff, eps = t["ff_ratio"] * w, t["layer_norm_eps"]
    approximate = c["gelu"] == "tanh"

    def init(key):
        keys = iter(jax.random.split(key, 3 + 4 * c["layers"]))
        p = {
            "wte": 0.02 * jax.random.normal(next(keys), (v, w)),
            "wpe": 0.02 * jax.random.normal(next(keys), (ctx, w)),
            "blocks": [
                {
                    "ln1": layer_norm_init(w, bias),
                    "qkv": normal_linear_init(next(keys), w, 3 * w, bias),
                    "proj": normal_linear_init(next(keys), w, w, bias),
                    "ln2": layer_norm_init(w, bias),
                    "fc": normal_linear_init(next(keys), w, ff, bias),
                    "fc2": normal_linear_init(next(keys), ff, w, bias),
                }
                for _ in range(c["layers"])
            ],
            "ln_f": layer_norm_init(w, bias),
        }
        head_key = next(keys)
        if not c["tied"]:
            p["head"] = normal_linear_init(head_key, w, v, bias)
        return p

    def block(p, x):
        b, s, _ = x.shape
        q, k, val = jnp.split(linear(p["qkv"], layer_norm(p["ln1"], x, eps)), 3, axis=-1)
        q, k, val = (z.reshape(b, s, heads, w // heads) for z in (q, k, val))
        y = jax.nn.dot_product_attention(q, k, val, is_causal=True).reshape(b, s, w)
        x = x + linear(p["proj"], y)
        h = jax.nn.gelu(linear(p["fc"], layer_norm(p["ln2"], x, eps)), approximate=approximate)
        return x + linear(p["fc2"], h)

    def apply(p, ids):
        x = p["wte"][ids] + p["wpe"][: ids.shape[1]]
        for bp in p["blocks"]:
            x = block(bp, x)
        x = layer_norm(p["ln_f"], x, eps)
        return x @ p["wte"].T if c["tied"] else linear(p["head"], x)

    return init, apply


def mlp(c):
    """ReLU between linear layers, none after the last."""
    d = c["dims"]

    def init(key):
        keys = jax.random.split(key, len(d) - 1)
        return [linear_init(keys[i], d[i], d[i + 1]) for i in range(len(d) - 1)]

    def apply(p, x):
        for i, lp in enumerate(p):
            x = linear(lp, x)
            if i + 1 < len(p):
                x = jax.nn.relu(x)
        return x

    return init, apply


def cnn(c):
    """Two same-padded convolutions, each with ReLU and max pooling, then a linear head; NHWC."""
    (h, w, ch), (c1, c2), k, pool = c["image"], c["channels"], c["kernel"], c["pool"]

    def conv_init(key, cin, cout):
        # PyTorch's default `nn.Conv2d` init: uniform in ±1/sqrt(cin·k·k), weights HWIO.
        kw, kb = jax.random.split(key)
        bound = 1.0 / math.sqrt(cin * k * k)
        return {
            "w": jax.random.uniform(kw, (k, k, cin, cout), minval=-bound, maxval=bound),
            "b": jax.random.uniform(kb, (cout,), minval=-bound, maxval=bound),
        }

    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        flat = c2 * (h // pool // pool) * (w // pool // pool)
        return {"conv1": conv_init(k1, ch, c1), "conv2": conv_init(k2, c1, c2),
                "head": linear_init(k3, flat, c["classes"])}

    def conv_relu_pool(p, x):
        x = jax.lax.conv_general_dilated(x, p["w"], (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        x = jax.nn.relu(x + p["b"])
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, pool, pool, 1),
                                     (1, pool, pool, 1), "VALID")

    def apply(p, x):
        x = conv_relu_pool(p["conv2"], conv_relu_pool(p["conv1"], x))
        return linear(p["head"], x.reshape(x.shape[0], -1))

    return init, apply


def mlp_lm(c):
    """Embedded context, flattened, a tanh layer, logits."""
    vocab, ctx, emb, hidden = c["vocab"], c["context"], c["embedding"], c["hidden"]

    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        # PyTorch's default `nn.Embedding` init: N(0, 1).
        return {"emb": jax.random.normal(k1, (vocab, emb)),
                "fc": linear_init(k2, ctx * emb, hidden), "out": linear_init(k3, hidden, vocab)}

    def apply(p, ids):
        e = p["emb"][ids].reshape(ids.shape[0], -1)
        return linear(p["out"], jnp.tanh(linear(p["fc"], e)))

    return init, apply


# The optimizers, as PyTorch's: `(init(params) -> state, update(grads, state, params) ->
# (params, state))`.


def sgd(lr):
    def init(params):
        return ()

    def update(grads, state, params):
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), state

    return init, update


def adam(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, clip_grad_norm=None):
    """`torch.optim.Adam` (weight_decay 0) or `torch.optim.AdamW` (decoupled weight decay on
    every parameter), after `clip_grad_norm_` when given."""
    b1, b2 = betas

    def init(params):
        # Two trees of their own: both are donated to the step.
        return {"t": jnp.zeros((), jnp.int32), "m": jax.tree.map(jnp.zeros_like, params),
                "v": jax.tree.map(jnp.zeros_like, params)}

    def update(grads, state, params):
        if clip_grad_norm is not None:
            norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
            scale = jnp.minimum(1.0, clip_grad_norm / (norm + 1e-6))
            grads = jax.tree.map(lambda g: g * scale, grads)
        t = state["t"] + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
        tf = t.astype(jnp.float32)
        step_size = lr / (1 - b1**tf)
        bc2_sqrt = jnp.sqrt(1 - b2**tf)

        def one(p, m, v):
            p = p * (1 - lr * weight_decay) if weight_decay else p
            return p - step_size * m / (jnp.sqrt(v) / bc2_sqrt + eps)

        return jax.tree.map(one, params, m, v), {"t": t, "m": m, "v": v}

    return init, update


def problem(cfg, name):
    """(init, apply), the batch's inputs and targets, the loss and the optimizer."""
    key = jax.random.key(0)
    k_init, kx, ky = jax.random.split(key, 3)
    for c in cfg["gpt"]:
        if c["name"] == name:
            t = cfg["gpt_training"]
            shape = (c["batch"], c["context"])
            x = jax.random.randint(kx, shape, 0, c["vocab"])
            y = jax.random.randint(ky, shape, 0, c["vocab"])
            opt = adam(t["lr"], tuple(t["betas"]), t["eps"], t["weight_decay"],
                       t["clip_grad_norm"])
            return gpt(c, t), k_init, x, y, cross_entropy, opt
    if cfg["mlp"]["name"] == name:
        c = cfg["mlp"]
        d = c["dims"]
        x = jax.random.normal(kx, (c["batch"], d[0]))
        y = jax.nn.one_hot(jax.random.randint(ky, (c["batch"],), 0, d[-1]), d[-1])
        return mlp(c), k_init, x, y, mse, sgd(c["lr"])
    if cfg["cnn"]["name"] == name:
        c = cfg["cnn"]
        x = jax.random.uniform(kx, (c["batch"], *c["image"]))
        y = jax.random.randint(ky, (c["batch"],), 0, c["classes"])
        return cnn(c), k_init, x, y, cross_entropy, adam(c["lr"])
    if cfg["mlp_lm"]["name"] == name:
        c = cfg["mlp_lm"]
        x = jax.random.randint(kx, (c["batch"], c["context"]), 0, c["vocab"])
        y = jax.random.randint(ky, (c["batch"],), 0, c["vocab"])
        return mlp_lm(c), k_init, x, y, cross_entropy, sgd(c["lr"])
    raise SystemExit(f"no model named {name}; --list lists them")


def train_step(apply, loss_fn, opt_update):
    """The whole step, forward, backward and update, as one jitted function; the parameters'
    and the optimizer state's buffers are donated to their updates."""

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(apply(p, x), y))(params)
        params, opt_state = opt_update(grads, opt_state, params)
        return params, opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def names(cfg):
    return [c["name"] for c in cfg["gpt"]] + [cfg[k]["name"] for k in ("mlp", "cnn", "mlp_lm")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    with open(CONFIG) as f:
        cfg = json.load(f)
    if a.list:
        print("\n".join(names(cfg)))
        return
    if not a.model:
        raise SystemExit("--model M (or --list)")
    (init, apply), k_init, x, y, loss_fn, (opt_init, opt_update) = problem(cfg, a.model)
    params = jax.jit(init)(k_init)
    opt_state = opt_init(params)
    # Compiled ahead of the first step, so that `compile_s` is until the step is runnable.
    step = train_step(apply, loss_fn, opt_update).lower(params, opt_state, x, y).compile()
    compile_s = time.perf_counter() - T0
    n_params = sum(p.size for p in jax.tree.leaves(params))
    # XLA's CPU thread pool spans the cores the process may run on.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    times, first_step_s, loss = [], None, math.nan
    for i in range(a.warmup + a.steps):
        t = time.perf_counter()
        params, opt_state, loss = jax.block_until_ready(step(params, opt_state, x, y))
        now = time.perf_counter()
        if first_step_s is None:
            first_step_s = now - T0
        if i >= a.warmup:
            times.append(now - t)
    med = statistics.median(times)
    print(json.dumps({
        "framework": "jax", "model": a.model, "step_s": med, "steps_per_s": 1.0 / med,
        "compile_s": compile_s, "first_step_s": first_step_s, "loss": float(loss),
        "params": n_params, "cores": cores,
        "backend": jax.default_backend(), "jax": jax.__version__,
    }))


if __name__ == "__main__":
    main()
