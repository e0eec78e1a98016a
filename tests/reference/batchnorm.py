"""Batch norm of rocannl (``nn::BatchNorm``) against PyTorch's ``BatchNorm1d`` / ``BatchNorm2d``.

Why this file exists: batch norm differs between training and evaluation, keeps running
statistics (with PyTorch's momentum convention and the unbiased variance in the estimate), and
its checkpoint must load into PyTorch's module. The Rust tests (``tensor/tests/batchnorm.rs``)
compare against values this script computed with PyTorch in float64, committed as
``batchnorm_expected.json`` so that CI needs no torch; where a torch venv exists, they also
run the ``--load`` mode on a checkpoint rocannl saved.

Layouts: rocannl keeps features in the output row and positions in the batch row, so PyTorch's
``(N, C)`` is rocannl's ``N | -> C``, ``(N, C, L)`` is ``N, L | -> C`` and an image
``(N, C, H, W)`` is ``N | -> H, W, C``. Every array in the JSON is flat in rocannl's memory
order (batch axes, then output axes).

Two modes:

- ``--generate`` (needs torch): writes ``batchnorm_expected.json`` beside this script: for each
  case the inputs, the train-mode output and gradients of ``sum(y * r)``, the running statistics
  after a few train-mode batches, the eval-mode output; and a small training run (SGD on
  ``mse``) with its final state dict and eval output.
- ``--load CHECKPOINT`` (needs torch): loads a rocannl checkpoint of the training run into
  ``torch.nn.BatchNorm1d`` with ``load_state_dict(strict=True)`` and prints the eval-mode output
  on the run's eval input as JSON.

    /path/to/torch/venv/bin/python tests/reference/batchnorm.py --generate
    /path/to/torch/venv/bin/python tests/reference/batchnorm.py --load bn.safetensors
"""

import argparse
import json
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "batchnorm_expected.json")

# name, module, PyTorch shape, momentum, affine, track_running_stats
CASES = [
    ("bn1d_nc", "1d", (6, 3), 0.1, True, True),
    ("bn1d_ncl", "1d", (2, 3, 4), 0.3, True, True),
    ("bn2d", "2d", (2, 3, 3, 2), 0.1, True, True),
    ("affine_off", "1d", (5, 4), 0.1, False, True),
    ("cumulative", "1d", (4, 2), None, True, True),
    ("untracked", "1d", (4, 3), 0.1, True, False),
]
STEPS = 3


def to_rocannl(t):
    """A PyTorch-layout tensor as a flat list in rocannl's memory order (channels last)."""
    if t.dim() > 2:
        t = t.permute(0, *range(2, t.dim()), 1)
    return [float(v) for v in t.reshape(-1)]


def module(kind, channels, momentum, affine, track):
    cls = torch.nn.BatchNorm1d if kind == "1d" else torch.nn.BatchNorm2d
    return cls(channels, momentum=momentum, affine=affine, track_running_stats=track,
               dtype=torch.float64)


def case(name, kind, shape, momentum, affine, track, gen):
    c = shape[1]
    rand = lambda: torch.randn(shape, generator=gen, dtype=torch.float64) * 2.0 + 0.5
    bn = module(kind, c, momentum, affine, track)
    weight = torch.rand(c, generator=gen, dtype=torch.float64) + 0.5
    bias = torch.randn(c, generator=gen, dtype=torch.float64)
    if affine:
        with torch.no_grad():
            bn.weight.copy_(weight)
            bn.bias.copy_(bias)
    batches = [rand() for _ in range(STEPS)]
    r = torch.randn(shape, generator=gen, dtype=torch.float64)
    bn.train()
    x0 = batches[0].clone().requires_grad_(True)
    y0 = bn(x0)
    (y0 * r).sum().backward()
    for b in batches[1:]:
        bn(b)
    eval_x = rand()
    bn.eval()
    with torch.no_grad():
        eval_y = bn(eval_x)
    out = {
        "name": name, "kind": kind, "torch_shape": list(shape), "momentum": momentum,
        "affine": affine, "track_running_stats": track, "eps": bn.eps,
        "weight": [float(v) for v in weight], "bias": [float(v) for v in bias],
        "batches": [to_rocannl(b) for b in batches], "r": to_rocannl(r),
        "train_y": to_rocannl(y0.detach()), "grad_x": to_rocannl(x0.grad),
        "eval_x": to_rocannl(eval_x), "eval_y": to_rocannl(eval_y),
    }
    if affine:
        out["grad_weight"] = [float(v) for v in bn.weight.grad]
        out["grad_bias"] = [float(v) for v in bn.bias.grad]
    if track:
        out["running_mean"] = [float(v) for v in bn.running_mean]
        out["running_var"] = [float(v) for v in bn.running_var]
        out["num_batches_tracked"] = int(bn.num_batches_tracked)
    return out


def training_run(gen):
    """BatchNorm1d on (N, C, L) trained by SGD (lr 0.1) on mse against targets, 4 steps."""
    shape, steps = (3, 2, 4), 4
    bn = module("1d", 2, 0.1, True, True)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.8, 1.3], dtype=torch.float64))
        bn.bias.copy_(torch.tensor([0.2, -0.1], dtype=torch.float64))
    opt = torch.optim.SGD(bn.parameters(), lr=0.1)
    xs = [torch.randn(shape, generator=gen, dtype=torch.float64) * 1.5 + 1.0 for _ in range(steps)]
    ts = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(steps)]
    bn.train()
    for x, t in zip(xs, ts):
        opt.zero_grad()
        torch.nn.functional.mse_loss(bn(x), t).backward()
        opt.step()
    eval_x = torch.randn(shape, generator=gen, dtype=torch.float64)
    bn.eval()
    with torch.no_grad():
        eval_y = bn(eval_x)
    state = {k: [float(v) for v in t.reshape(-1)] for k, t in bn.state_dict().items()}
    return {
        "torch_shape": list(shape), "steps": steps, "lr": 0.1,
        "weight": [0.8, 1.3], "bias": [0.2, -0.1],
        "xs": [to_rocannl(x) for x in xs], "targets": [to_rocannl(t) for t in ts],
        "eval_x": to_rocannl(eval_x), "eval_y": to_rocannl(eval_y), "state_dict": state,
    }


def read_safetensors(path):
    """The tensors of a safetensors file by name (an 8-byte little-endian header length, a JSON
    header of dtypes, shapes and byte ranges, the data)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    dtypes = {"F32": torch.float32, "F64": torch.float64}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        data = bytearray(raw[8 + n + lo:8 + n + hi])
        t = torch.frombuffer(data, dtype=dtypes[info["dtype"]]) if data else \
            torch.zeros(0, dtype=dtypes[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


def load(path):
    run = json.load(open(EXPECTED))["training_run"]
    tensors = read_safetensors(path)
    shape = run["torch_shape"]
    bn = module("1d", shape[1], 0.1, True, True)
    # The checkpoint's names are the state dict's of a model holding the block as `bn`: strict
    # loading checks that none is missing or unexpected.
    torch.nn.ModuleDict({"bn": bn}).load_state_dict(tensors, strict=True)
    bn.eval()
    n, c, l = shape
    eval_x = torch.tensor(run["eval_x"], dtype=torch.float64).reshape(n, l, c).permute(0, 2, 1)
    with torch.no_grad():
        y = bn(eval_x)
    json.dump({"eval_y": to_rocannl(y),
               "num_batches_tracked": int(bn.num_batches_tracked)}, sys.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--load")
    a = ap.parse_args()
    if a.load:
        return load(a.load)
    if not a.generate:
        ap.error("--generate or --load CHECKPOINT")
    gen = torch.Generator().manual_seed(0)
    out = {
        "torch": torch.__version__,
        "cases": [case(*c, gen) for c in CASES],
        "training_run": training_run(gen),
    }
    with open(EXPECTED, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
