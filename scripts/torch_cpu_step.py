#!/usr/bin/env python3
"""scripts/torch_cpu_step.py — a PyTorch CPU stand-in for the reference trainer's step on bench/train_cpu_bench.c's
shape (issue 28 item 7), to compare step times on the same cores.

The same computation as drafter_step + AdamW, written with ordinary torch ops the way a PyTorch trainer does it:
hidden 128, 2 full-attention layers (4 heads, 2 kv heads, head dim 32, MLP 384), vocabulary 2048, k = 2 captured
layers, block 8, 64 anchors, 1024-token packed batches (documents of 64..256 tokens, first 30% unsupervised), CE
loss with D-PACE weights (stop-gradient), the block attention as one SDPA call with a dense boolean mask over
(context + block) keys, the frozen embedding / LM heads, AdamW (lr 1e-3) after clipping at 1.0. It is not the
speculators trainer itself (that needs the target model and its data loader); it does the same arithmetic per step.

    pip install torch      (the CPU wheel is enough)
    python3 scripts/torch_cpu_step.py [--threads 2] [--steps 20] [--warmup 3] [--vocab 2048]

Prints the median and mean seconds per step (forward, backward and optimizer) and the process CPU time per step.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F


def rmsnorm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, inv_freq):   # x (rows, heads, d), pos (rows,)
    f = pos[:, None].float() * inv_freq[None, :]
    cos, sin = torch.cos(f)[:, None, :], torch.sin(f)[:, None, :]
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=1024)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    H, L, nh, nkv, dh, I, V, T, N, B, k = 128, 2, 4, 2, 32, 384, a.vocab, a.tokens, 64, 8, 2
    R, G = N * B, nh // nkv
    p = {}

    def mat(name, r, c):
        p[name] = torch.nn.Parameter(torch.randn(r, c) * 0.02)

    mat("fc", H, k * H)
    p["hnorm"] = torch.nn.Parameter(torch.ones(H))
    for l in range(L):
        p[f"{l}.ln1"] = torch.nn.Parameter(torch.ones(H))
        p[f"{l}.ln2"] = torch.nn.Parameter(torch.ones(H))
        p[f"{l}.qn"] = torch.nn.Parameter(torch.ones(dh))
        p[f"{l}.kn"] = torch.nn.Parameter(torch.ones(dh))
        mat(f"{l}.q", nh * dh, H)
        mat(f"{l}.k", nkv * dh, H)
        mat(f"{l}.v", nkv * dh, H)
        mat(f"{l}.o", H, nh * dh)
        mat(f"{l}.gate", I, H)
        mat(f"{l}.up", I, H)
        mat(f"{l}.down", H, I)
    p["norm"] = torch.nn.Parameter(torch.ones(H))
    embed = torch.rand(V, H) * 2 - 1
    lm = torch.rand(V, H) * 0.4 - 0.2
    vnorm = torch.rand(H) + 0.5
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dh, 2).float() / dh))
    opt = torch.optim.AdamW(list(p.values()), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)

    def batch():
        ids, pos, doc, mask = [], [], [], []
        d = 0
        while len(ids) < T:
            n = min(64 + int(torch.randint(0, 193, (1,), generator=gen)), T - len(ids))
            ids += torch.randint(0, V - 1, (n,), generator=gen).tolist()
            pos += list(range(n))
            doc += [d] * n
            mask += [1 if i >= int(0.3 * n) else 0 for i in range(n)]
            d += 1
        hidden = torch.rand(T, k * H, generator=gen) * 2 - 1
        last = torch.rand(T, H, generator=gen) * 2 - 1
        return (torch.tensor(ids), torch.tensor(pos), torch.tensor(doc), torch.tensor(mask, dtype=torch.bool),
                hidden, last)

    def step(ids, pos, doc, mask, hidden, last):
        cand = torch.nonzero(mask[: T - B]).flatten()
        anchors = cand[torch.randperm(len(cand), generator=gen)[:N]].sort().values
        tok = torch.full((N, B), V - 1)
        tok[:, 0] = ids[anchors]
        bpos = (pos[anchors][:, None] + torch.arange(B)[None, :]).flatten()
        x = embed[tok.flatten()]
        ctx = rmsnorm(F.linear(hidden + (torch.rand(hidden.shape, generator=gen) - 0.5) * 0.1, p["fc"]), p["hnorm"])
        # dense mask (R, T + R): the anchor's document before the anchor, then the whole own block
        key_doc = doc[None, :]
        a_col = anchors.repeat_interleave(B)[:, None]
        cm = (key_doc == doc[anchors].repeat_interleave(B)[:, None]) & (torch.arange(T)[None, :] < a_col)
        bm = torch.arange(R)[None, :] // B == torch.arange(R)[:, None] // B
        am = torch.cat([cm, bm], 1)
        allpos = torch.cat([pos, bpos])
        for l in range(L):
            xn = rmsnorm(x, p[f"{l}.ln1"])
            q = rmsnorm(F.linear(xn, p[f"{l}.q"]).view(R, nh, dh), p[f"{l}.qn"])
            kk = rmsnorm(torch.cat([F.linear(ctx, p[f"{l}.k"]), F.linear(xn, p[f"{l}.k"])]).view(T + R, nkv, dh),
                         p[f"{l}.kn"])
            vv = torch.cat([F.linear(ctx, p[f"{l}.v"]), F.linear(xn, p[f"{l}.v"])]).view(T + R, nkv, dh)
            q, kk = rope(q, bpos, inv_freq), rope(kk, allpos, inv_freq)
            kk, vv = kk.repeat_interleave(G, 1), vv.repeat_interleave(G, 1)
            o = F.scaled_dot_product_attention(q.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1),
                                               attn_mask=am[None])
            h = x + F.linear(o.transpose(0, 1).reshape(R, nh * dh), p[f"{l}.o"])
            xn2 = rmsnorm(h, p[f"{l}.ln2"])
            x = h + F.linear(F.silu(F.linear(xn2, p[f"{l}.gate"])) * F.linear(xn2, p[f"{l}.up"]), p[f"{l}.down"])
        z = F.linear(rmsnorm(x, p["norm"]), lm)
        src = (anchors[:, None] + torch.arange(B)[None, :] - 1).flatten() % T
        with torch.no_grad():
            tgt = F.linear(rmsnorm(last[src], vnorm), lm).argmax(-1)
        pp = (anchors[:, None] + torch.arange(B)[None, :]).flatten()
        m = (mask[pp.clamp(max=T - 1)] & (pp < T) & (torch.arange(R) % B != 0)).float()
        rl = F.cross_entropy(z, tgt, reduction="none")
        with torch.no_grad():   # D-PACE weights, alpha 0.5
            s = torch.where(m > 0, 0.5 * torch.exp(-rl) + 0.5, torch.ones_like(rl)).view(N, B)
            w = (torch.cumprod(s, 1) * m.view(N, B)).flip(1).cumsum(1).flip(1).flatten() * m
        loss = (w * rl).sum() / (m.sum() + 1e-5)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        return loss.item()

    times, cpus = [], []
    for s in range(a.warmup + a.steps):
        b = batch()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step(*b)
        if s >= a.warmup:
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    print(f"torch {torch.__version__}, {a.threads} threads, H {H}, L {L}, V {V}, T {T}, N {N}, B {B}: per step median "
          f"{statistics.median(times):.4f} s, mean {statistics.mean(times):.4f} s, CPU time {statistics.mean(cpus):.4f} s;"
          f" last loss {loss:.4f}")
    assert math.isfinite(loss)


if __name__ == "__main__":
    main()
