#!/usr/bin/env python3
"""The device's two ceilings, measured once per session (tools/gpu_session.sh runs this):
dense matrix products through PyTorch/cuBLAS (TF32 and BF16, 8192^3 on random data) and a large
device-to-device copy (bytes read + bytes written). Each is the median of 20 timed calls after 3
warm-ups, timed with CUDA events. Prints one 'ceiling,<name>,<value>,<unit>' line per figure."""
import statistics

import torch


def median_ms(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    torch.manual_seed(0)
    print(f"# device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    n = 8192
    for name, dtype, tf32 in (("tf32", torch.float32, True), ("bf16", torch.bfloat16, False),
                              ("fp32", torch.float32, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        ms = median_ms(lambda: a @ b)
        print(f"ceiling,matmul_{name},{2 * n**3 / ms * 1e-9:.1f},TFLOP/s")
    torch.backends.cuda.matmul.allow_tf32 = False
    src = torch.randn(2**30 // 4, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    print(f"ceiling,copy,{2 * src.numel() * 4 / ms * 1e-6:.1f},GB/s")


if __name__ == "__main__":
    main()
