"""Host cost of launching GEMMs from PyTorch on the local GPU machine, and which CPU issued them.

    python3 bench/gpu/host_launch_probe.py

Prints the CPU model, then the host microseconds per call (GPU kept busy by a sleep kernel so the
host never waits) for: torch.matmul on a 256x1024x1024 bf16 product; the same after torch.split
of the rows (one split per 64 GEMMs, as a per-expert loop does); and torch._grouped_mm over 64
groups (one call). Median of 5 bursts of 200 calls. Companion to moe_kernels_table.py, whose
host column is the per-expert loop including Python list handling.
"""
import platform
import statistics
import subprocess
import time

import torch


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def host_us(fn, calls: int) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(5):
        torch.cuda._sleep(400_000_000)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) * 1e6 / calls)
        torch.cuda.synchronize()
    return statistics.median(out)


def main() -> None:
    print("cpu:", cpu_model(), "| logical CPUs:", subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip())
    print("gpu:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
    a = torch.randn(256 * 64, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 1024, 1024, device="cuda", dtype=torch.bfloat16)
    offs = torch.arange(256, 256 * 64 + 1, 256, device="cuda", dtype=torch.int32)
    x = a[:256]
    print(f"torch.matmul, one call: {host_us(lambda: torch.matmul(x, w[0].t()), 200):.1f} us")

    def loop():
        for e, part in enumerate(torch.split(a, 256)):
            torch.matmul(part, w[e].t())
    print(f"per-expert loop (split + 64 matmuls), per GEMM: {host_us(loop, 4) / 64:.1f} us")
    print(f"torch._grouped_mm, 64 groups, one call: {host_us(lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs), 200):.1f} us")


if __name__ == "__main__":
    main()
