#!/usr/bin/env python3
"""scripts/rope_ref_torch.py — print transformers' RoPE inverse frequencies as torch computes them in
fp32 (the stored reference tests/data/rope_inv_freq_torch.txt of tests/test_hfconfig.c).

Lines: "<type> <theta> <dim> <i> <fp32 bits, hex>", type default | linear (factor 4) | llama3
(factor 8, low 1, high 4, original 8192), the formulas of transformers 5.24 modeling_rope_utils
(_compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
_compute_llama3_parameters) evaluated with torch. Run with ATEN_CPU_CAPABILITY=default: torch's
SIMD kernels take pow from SLEEF (powf_u10, 1 ulp off in a few entries, and which entries go
through it depends on the vector width), its scalar kernels from std::pow, correctly rounded.

  ATEN_CPU_CAPABILITY=default python3 scripts/rope_ref_torch.py > tests/data/rope_inv_freq_torch.txt
"""
import math
import struct

import torch

THETAS = [10000.0, 500000.0, 1e6, 1e7, 5e6, 1234567.0]
DIMS = [16, 32, 48, 64, 80, 96, 128, 256]


def bits(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


def main():
    print(f"# torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}")
    for th in THETAS:
        for d in DIMS:
            inv = 1.0 / (th ** (torch.arange(0, d, 2, dtype=torch.int64).to(dtype=torch.float) / d))
            lin = inv.clone()
            lin /= 4.0
            factor, low, high, old = 8.0, 1.0, 4.0, 8192
            low_wl, high_wl = old / low, old / high
            wl = 2 * math.pi / inv
            il = torch.where(wl > low_wl, inv / factor, inv)
            smooth = (old / wl - low) / (high - low)
            smoothed = (1 - smooth) * il / factor + smooth * il
            medium = ~(wl < high_wl) * ~(wl > low_wl)
            il = torch.where(medium, smoothed, il)
            for name, t in (("default", inv), ("linear", lin), ("llama3", il)):
                for i, v in enumerate(t.tolist()):
                    print(f"{name} {th!r} {d} {i} {bits(v):08x}")


if __name__ == "__main__":
    main()
