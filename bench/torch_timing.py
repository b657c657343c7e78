"""CUDA-event timing shared by the PyTorch reference benchmarks (torch_kernels.py,
torch_gpu_step.py): `warmup` untimed calls, then each of `runs` calls between two events."""

import torch


def event_times_ms(f, warmup, runs, device=None):
    for _ in range(warmup):
        f()
    torch.cuda.synchronize(device)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(runs):
        start.record()
        f()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times
