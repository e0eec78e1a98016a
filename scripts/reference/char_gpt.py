"""The PyTorch equivalent of examples/char_gpt.rs: the same data order, batches (the same
counter-based draws), model, optimizer, schedule and clipping, so that the two can be compared
on the same run (docs/models.md).

    python3 scripts/reference/char_gpt.py [--steps N] [--seed S] [--threads T] [--json]
    python3 scripts/reference/char_gpt.py --load char_gpt.safetensors [--json]

`--load` reads the checkpoint examples/char_gpt.rs saves into this module (`load_rocannl`)
and reports its validation loss, to compare with the one the Rust run printed.
"""

import argparse
import json
import math
import os
import struct
import time

T0 = time.perf_counter()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CONTEXT, BATCH, WIDTH, HEADS = 16, 32, 64, 4
M64 = (1 << 64) - 1


def name_key(name):
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M64
    return h ^ (h >> 33)


def uniform(seed, offset):
    """rocannl's counter-based generator (arrayjit::ops::uniform)."""
    z = (seed + ((offset + 1) * 0x9E3779B97F4A7C15)) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return (z >> 40) / 16777216.0


def data(path):
    with open(path) as f:
        names = [l.strip() for l in f if l.strip()]
    vocab = ["."] + sorted(set("".join(names)))
    names.sort(key=lambda n: (name_key(n), n))
    idx = {c: i for i, c in enumerate(vocab)}
    train, val = [], []
    for p, n in enumerate(names):
        s = val if p % 10 == 0 else train
        s.append(0)
        s.extend(idx[c] for c in n)
    train.append(0)
    val.append(0)
    return vocab, train, val


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH, eps=1e-5)
        self.q = nn.Linear(WIDTH, WIDTH, bias=False)
        self.k = nn.Linear(WIDTH, WIDTH, bias=False)
        self.v = nn.Linear(WIDTH, WIDTH, bias=False)
        self.o = nn.Linear(WIDTH, WIDTH, bias=False)
        self.ln2 = nn.LayerNorm(WIDTH, eps=1e-5)
        self.ff1 = nn.Linear(WIDTH, 4 * WIDTH)
        self.ff2 = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.ln1(x)
        split = lambda z: z.view(b, t, HEADS, WIDTH // HEADS).transpose(1, 2)
        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        scores = q @ k.transpose(-2, -1) / math.sqrt(WIDTH // HEADS)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, WIDTH)
        x = x + self.o(ctx)
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, WIDTH)
        self.pos = nn.Parameter(torch.randn(CONTEXT, WIDTH))
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(WIDTH, eps=1e-5)
        self.head = nn.Linear(WIDTH, vocab)

    def forward(self, ids):
        x = self.tok(ids) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def read_safetensors(path):
    """The tensors of a safetensors file, as float32 torch tensors by name (format: an 8-byte
    little-endian header length, a JSON header of dtypes, shapes and byte ranges, the data)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    dtypes = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        flat = torch.frombuffer(bytearray(body[lo:hi]), dtype=dtypes[t["dtype"]])
        out[name] = flat.reshape(t["shape"]).to(torch.float32)
    return out


def load_rocannl(path, model):
    """Loads a checkpoint of examples/char_gpt.rs into `model`. rocannl stores each tensor in
    memory order (batch, output, input): a linear layer's weight is (out, in) as in PyTorch; the
    attention projections keep their heads as axes — q/k/v (heads, head_dim, width), o (width,
    heads, head_dim) — which flatten, head-major, to PyTorch's (out, in); the token table is
    (width, vocab), the transpose of nn.Embedding's. Every parameter must be matched once."""
    t = read_safetensors(path)
    sd = {"tok.weight": t.pop("gpt.tok.table").T, "pos": t.pop("gpt.pos"),
          "ln_f.weight": t.pop("gpt.ln_f.gain"), "ln_f.bias": t.pop("gpt.ln_f.bias"),
          "head.weight": t.pop("gpt.head.w"), "head.bias": t.pop("gpt.head.b")}
    for i in range(len(model.blocks)):
        p, q = f"gpt.h{i}.", f"blocks.{i}."
        for ln in ("ln1", "ln2"):
            sd[q + ln + ".weight"] = t.pop(p + ln + ".gain")
            sd[q + ln + ".bias"] = t.pop(p + ln + ".bias")
        for proj in ("q", "k", "v", "o"):
            sd[q + proj + ".weight"] = t.pop(p + "att.w" + proj).reshape(WIDTH, WIDTH)
        for ff in ("ff1", "ff2"):
            sd[q + ff + ".weight"] = t.pop(p + ff + ".w")
            sd[q + ff + ".bias"] = t.pop(p + ff + ".b")
    if t:
        raise ValueError(f"parameters of the checkpoint not matched: {sorted(t)}")
    model.load_state_dict({k: v.contiguous() for k, v in sd.items()}, strict=True)


def val_loss_of(model, val, vocab):
    """Mean cross-entropy over every position of the non-overlapping 17-token windows."""
    val_t = torch.tensor(val)
    starts = list(range(0, len(val) - CONTEXT, CONTEXT))
    with torch.no_grad():
        x = torch.stack([val_t[s:s + CONTEXT] for s in starts])
        y = torch.stack([val_t[s + 1:s + CONTEXT + 1] for s in starts])
        return F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1)).item()


def lr_at(step, total, warmup=100, top=3e-3, low=3e-4):
    if step < warmup:
        return top * (step + 1) / warmup
    span = total - 1 - warmup
    t = min((step - warmup) / span, 1.0) if span > 0 else 0.0
    return low + 0.5 * (top - low) * (1 + math.cos(math.pi * t))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "../../data/names.txt"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--load", help="a checkpoint of examples/char_gpt.rs: report its validation loss")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    vocab, train, val = data(a.data)
    model = Gpt(len(vocab))
    if a.load:
        load_rocannl(a.load, model)
        out = {"val_loss": val_loss_of(model, val, vocab)}
        print(json.dumps(out) if a.json else out)
        return
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2 and not n.startswith("tok")]
    ids = {id(p) for p in decay}
    rest = [p for p in model.parameters() if id(p) not in ids]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.99), eps=1e-8)
    train_t = torch.tensor(train)
    windows = len(train) - CONTEXT
    losses = []
    start = time.perf_counter()
    first_step = None
    for t in range(a.steps):
        starts = [min(int(uniform(a.seed ^ 0x5EED, t * BATCH + b) * windows), windows - 1) for b in range(BATCH)]
        x = torch.stack([train_t[s:s + CONTEXT] for s in starts])
        y = torch.stack([train_t[s + 1:s + CONTEXT + 1] for s in starts])
        for g in opt.param_groups:
            g["lr"] = lr_at(t, a.steps)
        loss = F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if first_step is None:
            first_step = time.perf_counter() - T0
        if not a.json and (t % 200 == 0 or t + 1 == a.steps):
            print(f"step {t:>5}: loss {losses[-1]:.4f}")
    train_s = time.perf_counter() - start
    val_loss = val_loss_of(model, val, vocab)
    tail = losses[-50:]
    out = {"train_loss": sum(tail) / len(tail), "val_loss": val_loss, "steps_per_s": a.steps / train_s,
           "first_step_s": first_step, "wall_s": time.perf_counter() - T0, "params": sum(p.numel() for p in model.parameters())}
    print(json.dumps(out) if a.json else out)


if __name__ == "__main__":
    main()
