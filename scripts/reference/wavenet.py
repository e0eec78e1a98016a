"""The PyTorch equivalent of examples/wavenet.rs: a WaveNet-style hierarchical MLP over the
32,033 names of data/names32k.txt (embedding 27x24; three stages of "flatten two consecutive
positions -> linear without bias -> BatchNorm1d -> tanh"; a linear head), trained with SGD in
batches of 32 and evaluated with the batch norms' running statistics.

The data order, the split and the batches are the Rust example's (the same counter-based
draws), so the two runs see the same examples in the same order; the initial weights are drawn
from the same distributions (PyTorch's defaults, the head's weights scaled by 0.1), not the
same values.

    python3 scripts/reference/wavenet.py [--steps N] [--seed S] [--threads T] [--json]
    python3 scripts/reference/wavenet.py --load wavenet.safetensors [--json]

`--load` reads the checkpoint examples/wavenet.rs saves (params and batch-norm buffers) into
this module and reports its validation loss in eval mode, to compare with the Rust run's.
"""

import argparse
import json
import os
import sys
import struct
import time

T0 = time.perf_counter()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CONTEXT, EMBED, HIDDEN, BATCH = 8, 24, 128, 32
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from char_gpt import name_key, uniform  # noqa: E402  (the same order and draws)
DATA = os.path.join(HERE, "..", "..", "data", "names32k.txt")




def data():
    """Vocabulary, and (contexts, targets) of the train, validation and test splits: names in
    (name_key, name) order, position p % 10 == 0 validation, == 1 test, else training; every
    name gives one example per letter and one for its end, each with the 8 previous ids
    ('.' = 0 before the start)."""
    with open(DATA) as f:
        names = [l.strip() for l in f if l.strip()]
    vocab = ["."] + sorted(set("".join(names)))
    idx = {c: i for i, c in enumerate(vocab)}
    order = sorted(names, key=lambda n: (name_key(n), n))
    splits = ([], [], [])
    for p, n in enumerate(order):
        s = splits[1] if p % 10 == 0 else splits[2] if p % 10 == 1 else splits[0]
        ctx = [0] * CONTEXT
        for c in list(n) + ["."]:
            s.append((list(ctx), idx[c]))
            ctx = ctx[1:] + [idx[c]]
    out = []
    for s in splits:
        x = torch.tensor([e[0] for e in s], dtype=torch.long)
        y = torch.tensor([e[1] for e in s], dtype=torch.long)
        out.append((x, y))
    return vocab, out


class FlattenConsecutive(nn.Module):
    """(B, T, C) -> (B, T/n, C*n): n consecutive positions side by side."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x):
        b, t, c = x.shape
        return x.reshape(b, t // self.n, c * self.n)


class BatchNormPositions(nn.Module):
    """BatchNorm1d over (B, T, C): statistics over B and T, per channel."""

    def __init__(self, c):
        super().__init__()
        self.bn = nn.BatchNorm1d(c)

    def forward(self, x):
        return self.bn(x.transpose(1, 2)).transpose(1, 2)


class WaveNet(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.emb = nn.Embedding(vocab, EMBED)
        stages = []
        width = EMBED
        for _ in range(3):
            stages += [FlattenConsecutive(2), nn.Linear(2 * width, HIDDEN, bias=False),
                       BatchNormPositions(HIDDEN), nn.Tanh()]
            width = HIDDEN
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(HIDDEN, vocab)
        with torch.no_grad():
            self.head.weight *= 0.1

    def forward(self, ids):
        h = self.stages(self.emb(ids))
        return self.head(h.squeeze(1))


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        loss = F.cross_entropy(model(x), y).item()
    model.train()
    return loss


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        assert meta["dtype"] == "F32", meta
        t = torch.frombuffer(bytearray(body[a:b]), dtype=torch.float32)
        out[name] = t.reshape(meta["shape"]).clone()
    return out


def load_rocannl(model, path):
    """The Rust checkpoint's tensors into the module: names as the Rust example gives them."""
    st = read_safetensors(path)
    sd = model.state_dict()
    mapping = {"emb.weight": "emb.table"}
    for s in range(3):
        lin, bn = 4 * s + 1, 4 * s + 2
        mapping[f"stages.{lin}.weight"] = f"s{s}.linear.w"
        for k in ("weight", "bias", "running_mean", "running_var"):
            mapping[f"stages.{bn}.bn.{k}"] = f"s{s}.bn.{k}"
    mapping["head.weight"] = "head.w"
    mapping["head.bias"] = "head.b"
    new = {}
    for k, v in sd.items():
        if k.endswith("num_batches_tracked"):
            name = mapping[k.replace("num_batches_tracked", "running_mean")]
            count = st[name.replace("running_mean", "num_batches_tracked")]
            new[k] = count.to(v.dtype).reshape(v.shape)
            continue
        t = st[mapping[k]]
        if t.shape != v.shape and t.dim() == 2 and t.t().shape == v.shape:
            t = t.t()
        new[k] = t.reshape(v.shape)
    model.load_state_dict(new)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--load")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    vocab, ((xt, yt), (xv, yv), _) = data()
    torch.manual_seed(a.seed)
    model = WaveNet(len(vocab))
    if a.load:
        load_rocannl(model, a.load)
        val = evaluate(model, xv, yv)
        print(json.dumps({"val_loss": val}) if a.json else f"validation loss {val:.4f}")
        return
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = len(xt)
    losses = []
    started = time.perf_counter()
    for t in range(a.steps):
        lr = 0.1 if t < a.steps * 3 // 4 else 0.01
        for g in opt.param_groups:
            g["lr"] = lr
        rows = [int(uniform(a.seed ^ 0x5EED, t * BATCH + i) * n) for i in range(BATCH)]
        loss = F.cross_entropy(model(xt[rows]), yt[rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    train_s = time.perf_counter() - started
    val = evaluate(model, xv, yv)
    train = evaluate(model, xt, yt)
    rec = {"train_loss": train, "val_loss": val, "steps": a.steps, "seed": a.seed,
           "steps_per_s": a.steps / train_s, "wall_s": time.perf_counter() - T0,
           "params": sum(p.numel() for p in model.parameters()),
           "examples": {"train": n, "val": len(xv)}}
    if a.json:
        print(json.dumps(rec))
    else:
        print(f"{rec['params']} params; train loss {train:.4f}, validation loss {val:.4f}; "
              f"{rec['steps_per_s']:.0f} steps/s")


if __name__ == "__main__":
    main()
