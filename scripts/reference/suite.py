"""The PyTorch side of the model suite (docs/benchmarks.md, "The model suite"): every model of
benches/suite/models.json, built as a PyTorch user writes it, trained on random batches of the
configured shapes, timed step by step.

    python3 scripts/reference/suite.py --list
    python3 scripts/reference/suite.py --model gpt-w128-l4-c64 [--mode eager|compile]
        [--steps N] [--warmup W] [--threads T] [--device cpu|cuda]

Prints one JSON object: the model, the mode, `step_s` (the median of the timed steps' wall
times), `steps_per_s` (its inverse), `first_step_s` (from the start of the process, imports
included, to the end of the first step: torch.compile's compile is in it), `loss` (the last
step's) and `params`. The Rust side (examples/suite.rs) prints the same fields from the same
configuration file.
"""

import argparse
import json
import math
import os
import statistics
import time

T0 = time.perf_counter()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "..", "benches", "suite", "models.json")


class Block(nn.Module):
    """A pre-LayerNorm transformer block: causal self-attention and an MLP, each residual."""

    def __init__(self, c, t):
        super().__init__()
        w, bias = c["width"], c["bias"]
        self.heads = c["heads"]
        self.ln1 = nn.LayerNorm(w, eps=t["layer_norm_eps"], bias=bias)
        self.qkv = nn.Linear(w, 3 * w, bias=bias)
        self.proj = nn.Linear(w, w, bias=bias)
        self.ln2 = nn.LayerNorm(w, eps=t["layer_norm_eps"], bias=bias)
        self.fc = nn.Linear(w, t["ff_ratio"] * w, bias=bias)
        self.fc2 = nn.Linear(t["ff_ratio"] * w, w, bias=bias)
        self.approximate = "tanh" if c["gelu"] == "tanh" else "none"

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(w, dim=2)
        q, k, v = (z.view(b, s, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, s, w))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate=self.approximate))


class Gpt(nn.Module):
    def __init__(self, c, t):
        super().__init__()
        w = c["width"]
        self.wte = nn.Embedding(c["vocab"], w)
        self.wpe = nn.Embedding(c["context"], w)
        self.blocks = nn.ModuleList(Block(c, t) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(w, eps=t["layer_norm_eps"], bias=c["bias"])
        self.tied = c["tied"]
        if not self.tied:
            self.head = nn.Linear(w, c["vocab"], bias=c["bias"])
        # GPT-2's init, as the Rust side's GptConfig: weights N(0, 0.02), biases zero.
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        x = self.ln_f(x)
        return x @ self.wte.weight.t() if self.tied else self.head(x)


class Cnn(nn.Module):
    def __init__(self, c):
        super().__init__()
        (h, w, ch), (c1, c2), k = c["image"], c["channels"], c["kernel"]
        self.conv1 = nn.Conv2d(ch, c1, k, padding=k // 2)
        self.conv2 = nn.Conv2d(c1, c2, k, padding=k // 2)
        p = c["pool"]
        self.pool = p
        self.head = nn.Linear(c2 * (h // p // p) * (w // p // p), c["classes"])

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), self.pool)
        x = F.max_pool2d(F.relu(self.conv2(x)), self.pool)
        return self.head(x.flatten(1))


class MlpLm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c["vocab"], c["embedding"])
        self.fc = nn.Linear(c["context"] * c["embedding"], c["hidden"])
        self.out = nn.Linear(c["hidden"], c["vocab"])

    def forward(self, ids):
        return self.out(torch.tanh(self.fc(self.emb(ids).flatten(1))))


def problem(cfg, name):
    """The module, a batch of inputs and targets, the loss function and the optimizer."""
    g = torch.Generator().manual_seed(0)
    for c in cfg["gpt"]:
        if c["name"] == name:
            t = cfg["gpt_training"]
            model = Gpt(c, t)
            x = torch.randint(0, c["vocab"], (c["batch"], c["context"]), generator=g)
            y = torch.randint(0, c["vocab"], (c["batch"], c["context"]), generator=g)
            opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]),
                                    eps=t["eps"], weight_decay=t["weight_decay"])

            def loss(out, y):
                return F.cross_entropy(out.view(-1, out.shape[-1]), y.view(-1))

            return model, x, y, loss, opt, t["clip_grad_norm"]
    if cfg["mlp"]["name"] == name:
        c = cfg["mlp"]
        d = c["dims"]
        layers = []
        for i in range(len(d) - 1):
            layers.append(nn.Linear(d[i], d[i + 1]))
            if i + 2 < len(d):
                layers.append(nn.ReLU())
        model = nn.Sequential(*layers)
        x = torch.randn(c["batch"], d[0], generator=g)
        y = F.one_hot(torch.randint(0, d[-1], (c["batch"],), generator=g), d[-1]).float()
        opt = torch.optim.SGD(model.parameters(), lr=c["lr"])
        return model, x, y, F.mse_loss, opt, None
    if cfg["cnn"]["name"] == name:
        c = cfg["cnn"]
        h, w, ch = c["image"]
        model = Cnn(c)
        x = torch.rand(c["batch"], ch, h, w, generator=g)
        y = torch.randint(0, c["classes"], (c["batch"],), generator=g)
        opt = torch.optim.Adam(model.parameters(), lr=c["lr"])
        return model, x, y, F.cross_entropy, opt, None
    if cfg["mlp_lm"]["name"] == name:
        c = cfg["mlp_lm"]
        model = MlpLm(c)
        x = torch.randint(0, c["vocab"], (c["batch"], c["context"]), generator=g)
        y = torch.randint(0, c["vocab"], (c["batch"],), generator=g)
        opt = torch.optim.SGD(model.parameters(), lr=c["lr"])
        return model, x, y, F.cross_entropy, opt, None
    raise SystemExit(f"no model named {name}; --list lists them")


def names(cfg):
    return [c["name"] for c in cfg["gpt"]] + [cfg[k]["name"] for k in ("mlp", "cnn", "mlp_lm")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()
    with open(CONFIG) as f:
        cfg = json.load(f)
    if a.list:
        print("\n".join(names(cfg)))
        return
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model, x, y, loss_fn, opt, clip = problem(cfg, a.model)
    if a.device == "cuda":
        # The optimizer holds the parameters themselves: moved in place, it keeps them.
        model.to("cuda")
        x, y = x.to("cuda"), y.to("cuda")
    forward = torch.compile(model) if a.mode == "compile" else model

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(forward(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss.item()

    times, first_step_s, loss = [], None, math.nan
    for i in range(a.warmup + a.steps):
        t = time.perf_counter()
        loss = step()
        now = time.perf_counter()
        if first_step_s is None:
            first_step_s = now - T0
        if i >= a.warmup:
            times.append(now - t)
    med = statistics.median(times)
    print(json.dumps({
        "framework": "torch" if a.mode == "eager" else "torch.compile",
        "model": a.model, "step_s": med, "steps_per_s": 1.0 / med,
        "first_step_s": first_step_s, "loss": loss,
        "params": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "device": a.device,
    }))


if __name__ == "__main__":
    main()
