#!/usr/bin/env python3
"""The scaling model of docs/distributed.md: data parallelism on N hosts, on paper.

A step on N ranks (one per host) with the same global batch costs

    T(N) = T_compute / N + T_host + T_allreduce(N),
    T_allreduce(N) = 2 (N - 1) / N * S / B + 2 (N - 1) * a      (a ring all-reduce)

with S the gradient bytes per step, B the link's bandwidth, a its latency per message, and
T_host each rank's gathering and writing back of its gradients, proportional to S. The speedup
is (T_compute) / T(N): above 1, data parallelism pays.

The inputs are measured (docs/distributed.md, "Measured"): T_compute is a step's time on one
process at the suite's batch (docs/benchmarks.md, "The model suite"), T_host per MB of
gradients is from the data-parallel step on one rank. Prints a Markdown table.

    python3 scripts/distributed_model.py [--host-ms-per-mb X]
"""

import argparse

# (model, parameters, ms per step on one process: the suite's table)
MODELS = [
    ("gpt-w64-l2-c16 (char_gpt's shape)", 104_603, 4.64),
    ("gpt-w128-l4-c64", 804_096, 46.0),
    ("gpt-w192-l2-c32", 945_536, 52.2),
    ("gpt-w256-l4-c64", 3_241_472, 167.0),
    ("gpt-w384-l6-c128", 10_746_689, 475.0),
]

LINKS = [
    ("10 GbE", 1.25e9, 25e-6),
    ("100 Gb/s InfiniBand", 12.5e9, 3e-6),
]


def allreduce_s(n, size, bandwidth, latency):
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n * size / bandwidth + 2 * (n - 1) * latency


def table(host_ms_per_mb, ranks=(2, 4, 8, 16)):
    head = ("| model | gradients (MB) | step on 1 process (ms) | link | "
            + " | ".join(f"N = {n}" for n in ranks) + " |")
    rows = [head, "|" + "---|" * (4 + len(ranks))]
    for name, params, step_ms in MODELS:
        size = params * 4
        host_s = host_ms_per_mb * size / 1e6 / 1e3
        for link, bw, lat in LINKS:
            cells = []
            for n in ranks:
                t = step_ms / 1e3 / n + host_s + allreduce_s(n, size, bw, lat)
                cells.append(f"{step_ms / 1e3 / t:.2f}×")
            rows.append(f"| {name} | {size / 1e6:.2f} | {step_ms:g} | {link} | "
                        + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host-ms-per-mb", type=float, default=1.3,
                   help="gathering and writing back the gradients, ms per MB (measured: 1.3 "
                        "on the suite's largest GPT, 0.5 on char_gpt)")
    a = p.parse_args()
    print(table(a.host_ms_per_mb))
