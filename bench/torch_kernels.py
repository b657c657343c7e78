#!/usr/bin/env python3
"""PyTorch reference for bench_kernels: PyTorch's own CUDA kernels on the shapes bench_kernels
measures, timed the same way (torch.cuda.Event around each run, median of --runs after
--warmup), plus a 1 GiB device-to-device copy (dst.copy_(src)) as this run's reference.

Prints one JSON line per row: {"kernel", "shape", "median_ms", "torch", "device"}, and one with
"kernel": "copy". bench_kernels applies its own byte formulas to these times:
  GELU / ReLU forward            F.gelu(x) (exact), F.relu(x)            64M floats
  GELU / ReLU backward           autograd of the forward, given dy       64M floats
  bias gradient                  dy.sum(0)                               65536 x 1024
  layer norm forward             F.layer_norm (eps 1e-5)                 65536 x 1024
  layer norm forward + backward  the forward, then autograd for x, weight and bias
  softmax cross-entropy fwd+bwd  F.cross_entropy(sum) / rows, autograd for the logits, and the
                                 loss read back (.item(), as the fused op returns it)
                                                                          65536 x 256, 16384 x 32000
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from torch_timing import event_times_ms


def time_ms(f, warmup, runs):
    t = sorted(event_times_ms(f, warmup, runs))
    n = len(t)
    return t[n // 2] if n % 2 else 0.5 * (t[n // 2 - 1] + t[n // 2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr, flush=True)
        raise SystemExit(77)
    dev = torch.device("cuda", 0)
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev)}

    def emit(kernel, shape, ms):
        print(json.dumps({"kernel": kernel, "shape": shape, "median_ms": ms, **meta}), flush=True)

    def bench(f):
        return time_ms(f, a.warmup, a.runs)

    with torch.no_grad():
        src = torch.zeros(1 << 28, device=dev)  # 1 GiB of floats
        dst = torch.empty_like(src)
        emit("copy", "1 GiB", bench(lambda: dst.copy_(src)))
        del src, dst

    n = 64 << 20
    x = (torch.rand(n, device=dev) * 6 - 3).requires_grad_()
    dy = torch.rand(n, device=dev) * 2 - 1
    for name, f in (("GELU", F.gelu), ("ReLU", F.relu)):
        with torch.no_grad():
            emit(f"{name} forward", "64M", bench(lambda: f(x)))
        y = f(x)
        emit(f"{name} backward", "64M",
             bench(lambda: torch.autograd.grad(y, x, dy, retain_graph=True)))
        del y
    del x, dy

    r, feat = 65536, 1024
    with torch.no_grad():
        g = torch.rand(r, feat, device=dev) * 2 - 1
        emit("bias gradient", "65536×1024", bench(lambda: g.sum(0)))
        del g

    x = (torch.rand(r, feat, device=dev) * 2 - 1).requires_grad_()
    w = (torch.rand(feat, device=dev) + 0.5).requires_grad_()
    b = (torch.rand(feat, device=dev) - 0.5).requires_grad_()
    dy = torch.rand(r, feat, device=dev) * 2 - 1
    with torch.no_grad():
        emit("layer norm forward", "65536×1024",
             bench(lambda: F.layer_norm(x, (feat,), w, b, 1e-5)))

    def ln_fwd_bwd():
        y = F.layer_norm(x, (feat,), w, b, 1e-5)
        torch.autograd.grad(y, (x, w, b), dy)

    emit("layer norm forward + backward", "65536×1024", bench(ln_fwd_bwd))
    del x, w, b, dy

    for rows, classes in ((65536, 256), (16384, 32000)):
        logits = (torch.rand(rows, classes, device=dev) * 8 - 4).requires_grad_()
        labels = torch.randint(0, classes, (rows,), device=dev)
        scale = 1.0 / rows

        def xent():
            loss = F.cross_entropy(logits, labels, reduction="sum") * scale
            torch.autograd.grad(loss, logits)
            return loss

        emit("softmax cross-entropy forward + backward", f"{rows}×{classes}",
             bench(lambda: xent().item()))
        emit("softmax cross-entropy forward + backward, loss left on the device",
             f"{rows}×{classes}", bench(xent))
        del logits, labels
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
