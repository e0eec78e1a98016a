#!/usr/bin/env python3
"""The scaling model of docs/distributed.md: data parallelism on N hosts, on paper.

A step on N ranks with the same global batch costs

    T(N) = T_compute / N + T_host + T_allreduce(N),
    T_allreduce(N) = 2 (N - 1) / N * S / B + 2 (N - 1) * a      (a ring all-reduce)

with S the gradient bytes per step, B the link bandwidth, a the latency per message, and
T_host the gather and write-back of the gradients on each rank (measured). The speedup is
T_compute / T(N). The inputs are the measured compute time of a step on one process and the
gradient bytes; the links are the usual ones. Prints a Markdown table.

    python3 scripts/distributed_model.py
"""

# (model, gradient bytes per step, measured ms per step on one process, host ms per step)
MODELS = [
    ("char_gpt (gpt-w64-l2-c16)", 104_603 * 4, None, None),
    ("gpt-w128-l4-c64", 804_096 * 4, None, None),
    ("gpt-w256-l4-c64", 3_241_472 * 4, None, None),
    ("gpt-w384-l6-c128", 10_746_689 * 4, None, None),
]

LINKS = [
    ("10 GbE", 1.25e9, 25e-6),
    ("100 Gb/s InfiniBand", 12.5e9, 3e-6),
]


def allreduce_s(n, size, bandwidth, latency):
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n * size / bandwidth + 2 * (n - 1) * latency


def table(models, ranks=(2, 4, 8, 16)):
    head = "| model | grad MB | step ms (1 process) | link | " + " | ".join(
        f"N={n}" for n in ranks) + " |"
    rows = [head, "|" + "---|" * (4 + len(ranks))]
    for name, size, step_ms, host_ms in models:
        for link, bw, lat in LINKS:
            cells = []
            for n in ranks:
                t = step_ms / 1e3 / n + host_ms / 1e3 + allreduce_s(n, size, bw, lat)
                cells.append(f"{step_ms / 1e3 / t:.2f}×")
            rows.append(f"| {name} | {size / 1e6:.2f} | {step_ms:g} | {link} | "
                        + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    import argparse
    import json
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--measured", help="JSON: {model: [step_ms, host_ms]} (else the defaults "
                   "of docs/distributed.md)")
    a = p.parse_args()
    measured = {
        "char_gpt (gpt-w64-l2-c16)": (1.3, 0.15),
        "gpt-w128-l4-c64": (46.0, 0.9),
        "gpt-w256-l4-c64": (167.0, 3.5),
        "gpt-w384-l6-c128": (475.0, 12.0),
    }
    if a.measured:
        measured.update({k: tuple(v) for k, v in json.load(open(a.measured)).items()})
    print(table([(n, s, *measured[n]) for n, s, _, _ in MODELS]))
