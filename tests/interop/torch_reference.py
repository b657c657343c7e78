#!/usr/bin/env python3
"""PyTorch reference for the library's model zoo (tests/interop/test_torch_parity.cpp).

The test runs `torch_reference.py MODEL WORKDIR`, MODEL a zoo name (mlp, fashion-cnn, resnet18,
transformer-lm), and exchanges files with it in WORKDIR:

  config.json            the model's options (as the library's ZooOptions), lr, momentum,
                         weight_decay, steps, seed
  params.safetensors     the library's initial parameters and buffers, named <layer>.<param>
  batch.safetensors      "input" (float32 images or int32 token ids) and "labels" (int32)

It builds the same architecture in PyTorch with the same module names, loads params.safetensors
strictly (every tensor of the model must be in the file and every tensor of the file in the
model, with equal shapes), then runs `steps` training steps of torch.optim.SGD on the batch (mean
softmax cross-entropy, train mode) and writes out.safetensors:

  step<k>.logits, step<k>.loss                forward of step k (before its update)
  step<k>.grad.<name>                         parameter gradients of step k
  step<k>.param.<name>, step<k>.buffer.<name> parameters and buffers after step k's update

The other direction: it initialises a fresh model with PyTorch's own initialisers (seeded),
randomises the normalisation layers' affine parameters and running statistics (so that loading
them matters), writes that state as torch_init.safetensors for the library to load, and adds the
eval-mode logits of that model on the batch to out.safetensors as init.logits.

Safetensors is read and written here without the `safetensors` package: an 8-byte little-endian
header length, a JSON header (name -> dtype, shape, data_offsets; optional __metadata__), then
the raw little-endian tensor bytes.
"""
import json
import math
import os
import struct
import sys
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------
# safetensors

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32, "I64": torch.int64}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def read_safetensors(path):
    assert sys.byteorder == "little", "safetensors data is little-endian"
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    out = OrderedDict()
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] not in DTYPES:
            raise ValueError(f"{path}: tensor '{name}' has unsupported dtype {e['dtype']}")
        begin, end = e["data_offsets"]
        dtype = DTYPES[e["dtype"]]
        if end > begin:
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype)
        else:
            t = torch.empty(0, dtype=dtype)
        out[name] = t.reshape(e["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
    os.replace(path + ".tmp", path)


# --------------------------------------------------------------------------------------------
# models, named like src/nn/zoo.cpp and the composite layers' children


def scaled(n, width):
    # The library's std::lround(n * width), at least 1.
    return max(1, int(math.floor(n * width + 0.5)))


class GlobalAvgPool(nn.Module):
    def forward(self, x):
        return x.mean(dim=(2, 3))


class BasicBlock(nn.Module):
    """include/pipeline/nn/layers/residual_block.hpp (torchvision's BasicBlock names)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                                            nn.BatchNorm2d(cout))
        self.relu2 = nn.ReLU()

    def forward(self, x):
        h = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        s = x if self.downsample is None else self.downsample(x)
        return self.relu2(h + s)


class Embedding(nn.Module):
    """include/pipeline/nn/layers/embedding.hpp: token table plus learned positions."""

    def __init__(self, vocab, dim, max_positions):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, dim))
        self.position = nn.Parameter(torch.randn(max_positions, dim) * 0.02)

    def forward(self, ids):
        t = ids.shape[-1]
        return F.embedding(ids.long(), self.weight) + self.position[:t]


class TransformerBlock(nn.Module):
    """include/pipeline/nn/layers/transformer_block.hpp: pre-norm causal block, no dropout."""

    def __init__(self, dim, heads, mlp_ratio=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.gelu = nn.GELU()
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        dh = c // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, dh).transpose(1, 2) for z in (q, k, v))
        s = q @ k.transpose(-2, -1) / math.sqrt(dh)
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        p = s.masked_fill(causal, float("-inf")).softmax(dim=-1)
        a = (p @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(a)
        return x + self.fc2(self.gelu(self.fc1(self.ln2(x))))


def build(cfg):
    name = cfg["model"]
    width = cfg.get("width", 1.0)
    classes = cfg.get("num_classes", 10)
    if name == "mlp":
        c, s = cfg["channels"], cfg["image_size"]
        hidden = scaled(256, width)
        layers = [("flatten", nn.Flatten()), ("fc1", nn.Linear(c * s * s, hidden)),
                  ("relu1", nn.ReLU()), ("fc2", nn.Linear(hidden, hidden)),
                  ("relu2", nn.ReLU()), ("fc3", nn.Linear(hidden, classes))]
    elif name == "fashion-cnn":
        c, s = cfg["channels"], cfg["image_size"]
        q = s // 2 // 2
        layers = [("conv1", nn.Conv2d(c, 32, 5, 1, 2)), ("relu1", nn.ReLU()),
                  ("pool1", nn.MaxPool2d(2)), ("conv2", nn.Conv2d(32, 64, 5, 1, 2)),
                  ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)), ("flatten", nn.Flatten()),
                  ("fc1", nn.Linear(64 * q * q, 1024)), ("relu3", nn.ReLU()),
                  ("fc2", nn.Linear(1024, classes))]
    elif name == "resnet18":
        cin = scaled(64, width)
        layers = [("conv1", nn.Conv2d(cfg["channels"], cin, 3, 1, 1, bias=False)),
                  ("bn1", nn.BatchNorm2d(cin)), ("relu1", nn.ReLU())]
        for stage, w in enumerate((64, 128, 256, 512)):
            cout = scaled(w, width)
            for b in range(2):
                stride = 2 if stage > 0 and b == 0 else 1
                layers.append((f"layer{stage + 1}_{b + 1}", BasicBlock(cin, cout, stride)))
                cin = cout
        layers += [("avgpool", GlobalAvgPool()), ("fc", nn.Linear(cin, classes))]
    elif name == "transformer-lm":
        dim = cfg["dim"]
        layers = [("embed", Embedding(cfg["vocab"], dim, cfg["seq_len"]))]
        layers += [(f"block{b + 1}", TransformerBlock(dim, cfg["heads"]))
                   for b in range(cfg["blocks"])]
        layers += [("ln_f", nn.LayerNorm(dim)), ("head", nn.Linear(dim, cfg["vocab"]))]
    else:
        raise ValueError(f"unknown model '{name}'")
    return nn.Sequential(OrderedDict(layers))


def interchange_state(model):
    """The tensors the library exchanges: parameters and buffers, without BatchNorm's
    num_batches_tracked (the library keeps no such counter; it only matters for momentum=None)."""
    return OrderedDict((k, v) for k, v in model.state_dict().items()
                       if not k.endswith("num_batches_tracked"))


def load_strict(model, tensors, path):
    state = interchange_state(model)
    missing = [k for k in state if k not in tensors]
    unexpected = [k for k in tensors if k not in state]
    wrong = [f"{k}: file {list(tensors[k].shape)}, model {list(v.shape)}"
             for k, v in state.items() if k in tensors and tensors[k].shape != v.shape]
    if missing or unexpected or wrong:
        raise SystemExit(f"{path}: missing {missing}, unexpected {unexpected}, mis-shaped {wrong}")
    with torch.no_grad():
        for k, v in state.items():
            v.copy_(tensors[k])


# --------------------------------------------------------------------------------------------


def loss_of(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long())


def train_steps(cfg, batch, params_path, out):
    model = build(cfg)
    load_strict(model, read_safetensors(params_path), params_path)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
                          weight_decay=cfg["weight_decay"])
    x, y = batch["input"], batch["labels"]
    for step in range(1, cfg["steps"] + 1):
        opt.zero_grad()
        logits = model(x)
        loss = loss_of(logits, y)
        loss.backward()
        p = f"step{step}."
        out[p + "logits"] = logits.detach().clone()
        out[p + "loss"] = loss.detach().reshape(1).clone()
        for k, v in model.named_parameters():
            out[p + "grad." + k] = v.grad.detach().clone()
        opt.step()
        for k, v in model.named_parameters():
            out[p + "param." + k] = v.detach().clone()
        for k, v in model.named_buffers():
            if not k.endswith("num_batches_tracked"):
                out[p + "buffer." + k] = v.detach().clone()


def torch_init(cfg, batch, init_path, out):
    torch.manual_seed(cfg["seed"])
    model = build(cfg)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    # The whole state dict, as a PyTorch user would save it: the library loads what it needs and
    # ignores extras such as BatchNorm's int64 num_batches_tracked.
    write_safetensors(init_path, model.state_dict())
    model.eval()
    with torch.no_grad():
        out["init.logits"] = model(batch["input"]).clone()


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: torch_reference.py MODEL WORKDIR (WORKDIR holding config.json, "
                         "params.safetensors and batch.safetensors)")
    work = sys.argv[2]
    with open(os.path.join(work, "config.json")) as f:
        cfg = json.load(f)
    cfg["model"] = sys.argv[1]
    torch.set_num_threads(1)
    batch = read_safetensors(os.path.join(work, "batch.safetensors"))
    out = OrderedDict()
    train_steps(cfg, batch, os.path.join(work, "params.safetensors"), out)
    torch_init(cfg, batch, os.path.join(work, "torch_init.safetensors"), out)
    write_safetensors(os.path.join(work, "out.safetensors"), out)


if __name__ == "__main__":
    main()
