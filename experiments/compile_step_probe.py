"""Probe: a hand-written decoding step of SmolLM2's shapes (30 layers of the Hedgehog hybrid,
W = 64, S = 4, M = 64, random weights, then the vocabulary head), eager against
``torch.compile`` (inductor, CPU), and the weight reads alone (every matmul, nothing else).

Not the library's code path: a bound on what compiling the step could gain on this CPU.
Usage: ``python experiments/compile_step_probe.py [THREADS]``. Session 13 (AMD EPYC, 2 cores):
eager 87.3 -> compiled 75.0 ms/token at one thread (matmuls alone 62.7); at two threads, two
runs, 97.7 -> 73.4 and 86.1 -> 68.6 (matmuls alone 58.6 and 60.6); the compile 3-8 s.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

D, H, HK, DH, M, W, S, FF, V = 576, 9, 3, 64, 64, 64, 4, 1536, 49152
G = H // HK


def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


def rot(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


def layer_step(x, cos, sin, p, onehot, valid, leave):
    """One block, one token: returns the output and the layer's new ring and linear state."""
    B = x.shape[0]
    h = rms(x, p["n1"])
    q = rot((h @ p["wq"].t()).view(B, HK, G, DH), cos, sin) * DH ** -0.25
    k = rot((h @ p["wk"].t()).view(B, HK, 1, DH), cos, sin) * DH ** -0.25
    v = (h @ p["wv"].t()).view(B, HK, 1, DH)
    oh = onehot.view(1, 1, W, 1)
    k_out, v_out = (p["rk"] * oh).sum(2, keepdim=True), (p["rv"] * oh).sum(2, keepdim=True)
    rk, rv = torch.lerp(p["rk"], k, oh), torch.lerp(p["rv"], v, oh)
    f = torch.cat([q, k_out], 2) @ p["om"].transpose(-1, -2)  # (B, Hk, G + 1, M)
    f = torch.softmax(f.view(B, HK, G + 1, 2, M // 2), -1).view(B, HK, G + 1, M)
    kv = torch.addcmul(p["kv"], f[:, :, G:].transpose(-1, -2),
                       F.pad(v_out, (0, 1), value=1.0) * leave)
    n = f[:, :, :G] @ kv
    kb, vb = torch.cat([p["sk"], rk], 2), torch.cat([p["sv"], rv], 2)
    logits = (q @ kb.transpose(-1, -2)).masked_fill(~valid, float("-inf"))
    r = torch.maximum(logits.amax(-1, keepdim=True), n[..., -1:].log())
    e = torch.exp(logits - r)
    g = p["gam"].view(1, HK, G, 1)
    num = g * (e @ vb) + n[..., :-1] * torch.exp(-r)
    den = g * e.sum(-1, keepdim=True) + n[..., -1:] * torch.exp(-r)
    hh = x + (num / den).reshape(B, 1, D) @ p["wo"].t()
    z = rms(hh, p["n2"])
    return hh + (F.silu(z @ p["wg"].t()) * (z @ p["wu"].t())) @ p["wd"].t(), rk, rv, kv


def main(threads: int) -> None:
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    layers = [dict(n1=torch.ones(D), wq=r(D, D), wk=r(HK * DH, D), wv=r(HK * DH, D),
                   wo=r(D, D), n2=torch.ones(D), wg=r(FF, D), wu=r(FF, D), wd=r(D, FF),
                   om=r(HK, M, DH), gam=torch.rand(H, generator=gen), sk=r(1, HK, S, DH),
                   sv=r(1, HK, S, DH), rk=r(1, HK, W, DH), rv=r(1, HK, W, DH),
                   kv=torch.rand(1, HK, M, DH + 1, generator=gen)) for _ in range(30)]
    head = r(V, D)
    x0, cos, sin = r(1, 1, D), torch.rand(DH, generator=gen), torch.rand(DH, generator=gen)
    onehot = torch.zeros(W)
    onehot[5] = 1.0
    valid, leave = torch.ones(W + S, dtype=torch.bool), torch.tensor(1.0)

    def token(fn):
        x = x0
        for p in layers:
            x, p["rk"], p["rv"], p["kv"] = fn(x, cos, sin, p, onehot, valid, leave)
            x = x / x.norm()
        return x @ head.t()

    def weights_only():
        x, z = x0, r(1, 1, FF)
        for p in layers:
            for name in ("wq", "wk", "wv", "wo", "wg", "wu"):
                x @ p[name].t()
            z @ p["wd"].t()
        return x @ head.t()

    def median_ms(f, n=20):
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return 1000 * statistics.median(ts[3:])

    with torch.no_grad():
        compiled = torch.compile(layer_step, dynamic=False)
        t = time.perf_counter()
        token(compiled)
        print(f"compile {time.perf_counter() - t:.1f} s")
        print(f"eager {median_ms(lambda: token(layer_step)):.1f} ms/token")
        print(f"compiled {median_ms(lambda: token(compiled)):.1f} ms/token")
        print(f"matmuls alone {median_ms(weights_only):.1f} ms/token")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
