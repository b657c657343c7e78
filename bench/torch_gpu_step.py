#!/usr/bin/env python3
"""PyTorch reference for bench_gpu_step: one training step (zero_grad, forward, loss, backward,
optimizer step) of the zoo's models in PyTorch eager on cuda:0, with the same layers, batch,
optimizer and precision, and torch.backends.cudnn.benchmark = True.

Prints one JSON line per (case, precision):
  {"case", "precision", "median_ms", "q1_ms", "q3_ms", "peak_bytes", "torch", "device"}
median/quartiles over --steps steps after --warmup, each timed with torch.cuda.Event around the
step; peak_bytes = torch.cuda.max_memory_allocated() over the case (reset before it). Precision
fp32 and tf32 set torch.backends.{cuda.matmul,cudnn}.allow_tf32; bf16 runs the forward and the
loss under torch.autocast("cuda", dtype=torch.bfloat16) (fp32 master weights and optimizer), as
the library's --dtype bf16 does. With --compile the same step also runs with the model through
torch.compile (default mode), adding "compile_median_ms" (and its quartiles) to the line.

The models are those of src/nn/zoo.cpp:
  fashion-cnn     conv1(1->32, 5x5, pad 2) ReLU MaxPool2 conv2(32->64, 5x5, pad 2) ReLU MaxPool2
                  Flatten fc1(3136->1024) ReLU fc2(1024->10)
  vgg16           configuration D, 3x3 pad 1 convolutions + ReLU, MaxPool2 after each block,
                  Flatten fc1(512*s*s->4096) ReLU Dropout(0.5) fc2(4096->4096) ReLU Dropout(0.5)
                  fc3(4096->classes)
  transformer-lm  Embedding(vocab, dim) + learned positions [seq_len, dim]; pre-norm blocks
                  x1 = x + proj(causal_attention(qkv(ln1(x)))), y = x1 + fc2(gelu(fc1(ln2(x1))))
                  (qkv Linear(dim, 3 dim) holding q, k, v side by side, mlp ratio 4, exact GELU,
                  no dropout); ln_f; head Linear(dim, vocab)
The loss is cross-entropy summed over samples (tokens) times 1/batch, as SequentialTrainer's.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

CASES = {
    # name: (model, options, batch, optimizer)
    "fashion-cnn-b64": ("fashion-cnn", {}, 64, "sgd"),
    "fashion-cnn-b1024": ("fashion-cnn", {}, 1024, "sgd"),
    "vgg16-b64": ("vgg16", {"image_size": 224, "num_classes": 1000}, 64, "sgd"),
    "transformer-lm-b16": ("transformer-lm", {"vocab": 256, "seq_len": 1024, "dim": 1024,
                                              "heads": 16, "blocks": 24}, 16, "adamw"),
}


# fashion-cnn and transformer-lm are the parity reference's models (tests/interop, checked against
# the library layer by layer); only vgg16 and the attention kernel are this benchmark's own.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "interop"))
import torch_reference  # noqa: E402
from torch_timing import event_times_ms  # noqa: E402


def vgg16(image_size=32, num_classes=10, channels=3):
    blocks = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]
    layers, c_in, size = [], channels, image_size
    for block in blocks:
        for c_out in block:
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU()]
            c_in = c_out
        layers.append(nn.MaxPool2d(2))
        size //= 2
    layers += [nn.Flatten(),
               nn.Linear(c_in * size * size, 4096), nn.ReLU(), nn.Dropout(0.5),
               nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(0.5),
               nn.Linear(4096, num_classes)]
    return nn.Sequential(*layers)


class FusedAttentionBlock(torch_reference.TransformerBlock):
    """The reference block with PyTorch's fused attention (what a PyTorch user would run) instead
    of the reference's explicit T x T softmax."""

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch < 2.0
            s = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            a = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(self.gelu(self.fc1(self.ln2(x))))


def build(model, options):
    if model == "vgg16":
        return vgg16(**options)
    cfg = {"model": model, "channels": 1, "image_size": 28, "num_classes": 10, "vocab": 256,
           "seq_len": 64, "dim": 128, "heads": 4, "blocks": 4}
    cfg.update(options)
    net = torch_reference.build(cfg)
    if model == "transformer-lm":
        for name, child in list(net.named_children()):
            if isinstance(child, torch_reference.TransformerBlock):
                fused = FusedAttentionBlock(cfg["dim"], cfg["heads"])
                setattr(net, name, fused)
    return net


def quantile(values, q):
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


def run_case(name, precision, warmup, steps, device, compile_too=False):
    model_name, options, batch, opt_name = CASES[name]
    tf32 = precision == "tf32"
    bf16 = precision == "bf16"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(1)
    model = build(model_name, options).to(device).train()
    if model_name == "transformer-lm":
        vocab, t = options["vocab"], options["seq_len"]
        x = torch.randint(0, vocab, (batch, t), device=device)
        y = torch.randint(0, vocab, (batch, t), device=device)
        classes = vocab
    else:
        size = options.get("image_size", 28)
        channels = 1 if model_name == "fashion-cnn" else 3
        classes = options.get("num_classes", 10)
        x = torch.randn(batch, channels, size, size, device=device)
        y = torch.randint(0, classes, (batch,), device=device)
    if opt_name == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=1e-2)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scale = 1.0 / batch

    def make_step(net):
        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                logits = net(x)
                loss = F.cross_entropy(logits.reshape(-1, classes).float(), y.reshape(-1),
                                       reduction="sum") * scale
            loss.backward()
            opt.step()
        return step

    times = event_times_ms(make_step(model), warmup, steps, device)
    peak = torch.cuda.max_memory_allocated(device)
    out = {"case": name, "precision": precision, "median_ms": quantile(times, 0.5),
           "q1_ms": quantile(times, 0.25), "q3_ms": quantile(times, 0.75), "peak_bytes": peak,
           "torch": torch.__version__, "device": torch.cuda.get_device_name(device)}
    if compile_too:
        compiled = torch.compile(model)
        # The first calls compile: more warm-up, untimed.
        times = event_times_ms(make_step(compiled), max(warmup, 3), steps, device)
        out.update({"compile_median_ms": quantile(times, 0.5),
                    "compile_q1_ms": quantile(times, 0.25), "compile_q3_ms": quantile(times, 0.75)})
        del compiled
    del model, opt, x, y
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--precision", default="fp32,tf32")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--compile", action="store_true", help="also time the model under torch.compile")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr, flush=True)
        raise SystemExit(77)
    device = torch.device("cuda", 0)
    torch.empty(1, device=device)  # the caching allocator exists only after a first allocation
    for name in [c for c in a.cases.split(",") if c]:
        if name not in CASES:
            raise SystemExit(f"unknown case {name!r}: choose from {', '.join(CASES)}")
        for precision in [p for p in a.precision.split(",") if p]:
            if precision not in ("fp32", "tf32", "bf16"):
                raise SystemExit(f"unknown precision {precision!r}: fp32, tf32 or bf16")
            print(json.dumps(run_case(name, precision, a.warmup, a.steps, device, a.compile)),
                  flush=True)


if __name__ == "__main__":
    main()
