"""How well this CPU's float32 kernels use it at decoding shapes, against its own ceilings.

Prints, per thread count: the memory read bandwidth (a sum over a 2 GiB tensor) and the GFLOP/s
of a square 2048 GEMM (near the compute ceiling), then, per row count, the GFLOP/s of a product
through the route the models' linear layers take (``edgespec.models.cpu_linear.linear``) and
the rate its weight is read at. A product far below both ceilings is bound by the kernel's
efficiency at that shape, not by memory or arithmetic:

    python bench/bench_kernels.py --rows 1 5 16 80
"""

from __future__ import annotations

import argparse

import torch

from edgespec.models.cpu_linear import linear
from edgespec.models.precision import cpu_flags, median_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 16, 80])
    parser.add_argument("--in-features", type=int, default=1536)
    parser.add_argument("--out-features", type=int, default=8960)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(0)
    big = torch.randn(2**29, generator=gen)  # 2 GiB, far beyond any cache
    a, b = torch.randn(2048, 2048, generator=gen), torch.randn(2048, 2048, generator=gen)
    weight = torch.randn(args.out_features, args.in_features, generator=gen) * 0.02
    flags = ", ".join(sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma"))))
    print(f"CPU flags: {flags}; float32; medians of {args.repeats}\n")
    print("| threads | what | GFLOP/s | GB/s read |")
    print("|---|---|---|---|")
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            seconds = median_seconds(big.sum, max(3, args.repeats // 4))
            print(f"| {threads} | sum over 2 GiB | | {big.numel() * 4 / seconds / 1e9:.1f} |")
            seconds = median_seconds(lambda: a @ b, args.repeats)
            print(f"| {threads} | square GEMM 2048 | {2 * 2048**3 / seconds / 1e9:.1f} | |")
            for rows in args.rows:
                x = torch.randn(rows, args.in_features, generator=gen)
                seconds = median_seconds(lambda x=x: linear(x, weight), args.repeats)
                flops = 2 * rows * args.in_features * args.out_features
                print(
                    f"| {threads} | {rows} rows x {args.in_features} -> {args.out_features} | "
                    f"{flops / seconds / 1e9:.1f} | {weight.numel() * 4 / seconds / 1e9:.1f} |"
                )


if __name__ == "__main__":
    main()
