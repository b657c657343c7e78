#!/usr/bin/env python3
"""PyTorch reference for bench/compare_torch.sh: trains the zoo's `fashion-cnn` or `mlp`
(same layers, batch, optimizer and thread count as bench_train) on random Fashion-MNIST-shaped
data and prints one JSON line {"model", "batch", "threads", "samples_per_s"}. With --profile,
the same steps once more under torch.profiler, each op's CPU time per step printed to stderr
(beside `pipeline-profile`'s layer times, where the two libraries' steps differ)."""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn


def fashion_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 1024), nn.ReLU(), nn.Linear(1024, 10))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                         nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="fashion-cnn", choices=["fashion-cnn", "mlp"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = fashion_cnn() if a.model == "fashion-cnn" else mlp()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(a.batch, 1, 28, 28)
    y = torch.randint(0, 10, (a.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = time.perf_counter() - t0
    print(json.dumps({"model": a.model, "batch": a.batch, "threads": a.threads,
                      "samples_per_s": a.steps * a.batch / dt, "torch": torch.__version__}))
    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.steps):
                step()
        print(f"per step of {a.steps} (ms): each op's self CPU time", file=sys.stderr)
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:16]:
            print(f"  {e.key:48s} {e.self_cpu_time_total / 1000 / a.steps:8.3f}  "
                  f"{e.count / a.steps:5.1f} calls", file=sys.stderr)


if __name__ == "__main__":
    main()
