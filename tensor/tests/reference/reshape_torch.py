"""Expected values of tensor/tests/reshape.rs, computed with PyTorch's `view`.

rocannl lays a tensor's cells out row-major over batch, then output, then input axes, so a
tensor of batch `B, T` and output `C` is PyTorch's contiguous `(B, T, C)`, and a parameter of
input `I` and output `O` is PyTorch's `(O, I)` weight of `y @ W.T`.

Run: python3 tensor/tests/reference/reshape_torch.py
"""

import torch

torch.set_default_dtype(torch.float64)


def x_values():
    # x[k] = ((7 k) mod 24) / 10 - 1.1, for the 2 * 4 * 3 cells in memory order.
    return torch.tensor([((7 * k) % 24) / 10 - 1.1 for k in range(24)]).view(2, 4, 3)


def w_values():
    # w[o, i] = ((5 (6 o + i)) mod 11) / 10 - 0.5, 5 outputs and 6 inputs.
    return torch.tensor([((5 * k) % 11) / 10 - 0.5 for k in range(30)]).view(5, 6)


def flatten_consecutive():
    """WaveNet's FlattenConsecutive(2) then a linear layer without bias and tanh:
    loss = sum(sin(tanh(x.view(B, T // 2, 2 * C) @ W.T)))."""
    x = x_values().requires_grad_()
    w = w_values().requires_grad_()
    h = torch.tanh(x.view(2, 2, 6) @ w.T)
    loss = torch.sin(h).sum()
    loss.backward()
    return h, x.grad, w.grad


def heads():
    """Split 6 channels into 2 heads of 3 (unflatten), a per-head sum of squares times the head
    index + 1, merged back: y = (x.unflatten(-1, (2, 3)) ** 2 * [[1], [2]]).flatten(-2)."""
    x = x_values().view(8, 3).reshape(4, 6)
    y = (x.unflatten(-1, (2, 3)) ** 2 * torch.tensor([[1.0], [2.0]])).flatten(-2)
    return y


def fmt(t):
    return "[" + ", ".join(f"{v:.12f}" for v in t.detach().reshape(-1).tolist()) + "]"


if __name__ == "__main__":
    h, gx, gw = flatten_consecutive()
    print("flatten_consecutive h =", fmt(h))
    print("flatten_consecutive dx =", fmt(gx))
    print("flatten_consecutive dw =", fmt(gw))
    print("heads y =", fmt(heads()))
