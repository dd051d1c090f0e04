"""Speed-up of data-parallel phase A and phase B: K processes (torchrun, gloo) versus one.

Usage (launcher: runs every configuration with torchrun and writes a table)::

    .venv/bin/python experiments/bench_distributed.py --out runs/bench_distributed

It launches ``torchrun --standalone --nproc-per-node=K experiments/bench_distributed.py
--worker ...`` for (processes x threads per process) in ``--configs`` (default
``1x1,1x2,2x1``: one process with one thread, one process with two threads, two processes
with one thread each) and times, on rank 0, after a warm-up:

* ``phase_a_core``   full-batch projected Langevin on ``H = -A + lam W`` over a sharded
  dataset (the streamed alignment statistics and gradient all-reduced) - the part that is
  exactly data-parallel;
* ``phase_a_model``  :func:`coulomb_attention.train.phases.align_features` on a small
  Transformer (query collection + Langevin on per-rank mini-batches);
* ``phase_b``        one epoch of :func:`coulomb_attention.train.loop.fit` (DDP + sharded
  sampler) on synthetic token data.

Besides the wall time on rank 0, every rank's CPU time (``time.process_time``) is recorded:
``CPU(1x1) / max over ranks CPU(Kx1)`` is the speed-up the critical path allows, which is
what the wall clock shows on an otherwise idle machine with K free cores (it ignores time
spent waiting for a peer and memory-bandwidth contention).

The total work is the same for every K: K processes each get 1/K of the examples and a
per-process batch of ``B / K``, so each step covers the same global batch. Rank 0 also
records a checksum of the result (final particles, final loss) so the K-process run can be
compared with the one-process run. The machine load (``os.getloadavg``) is recorded with
every row: on a shared 2-core machine the numbers depend on what else runs.

Writes ``OUT/results.jsonl`` (one row per configuration and workload) and ``OUT/summary.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

# ----------------------------------------------------------------------------- workloads


class _Timer:
    """Wall time on rank 0 and the CPU time (``time.process_time``) of every rank."""

    def __init__(self, rt) -> None:
        self.rt = rt

    def __enter__(self):
        self.rt.barrier()
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        cpu = time.process_time() - self.c0
        self.rt.barrier()
        self.wall = time.perf_counter() - self.t0
        per_rank = torch.zeros(self.rt.world_size, dtype=torch.float64)
        per_rank[self.rt.rank] = cpu
        (per_rank,) = self.rt.all_reduce_sum([per_rank])
        self.cpu = per_rank.tolist()

    def row(self) -> dict:
        return {"time_s": self.wall, "cpu_s_per_rank": self.cpu}


def _phase_a_core(rt, args) -> dict:
    from coulomb_attention import dynamics as D
    from coulomb_attention import energy as E
    from coulomb_attention import features as F
    from coulomb_attention.train.distributed import shard

    gen = torch.Generator().manual_seed(0)
    n, d, m = args.a_examples, 16, args.a_features
    x = torch.randn(n, d, generator=gen)
    y, _ = E.encode_labels(((x[:, :4] ** 2).sum(1) > 4).long().numpy())
    omega0 = F.gaussian(m, d, generator=gen) * 0.5
    bias = F.draw_bias(m, generator=gen)
    feats = F.feature_fn("rff", bias=bias)
    xs, ys = shard((x, y), rt.rank, rt.world_size)
    bs = 1024
    batches = [(xs[i:i + bs], ys[i:i + bs]) for i in range(0, xs.shape[0], bs)]
    ham = E.Hamiltonian(E.LabelAlignment(feats), E.make_potential("riesz", s=1.0, eps=0.1),
                        lam=0.1)
    gen = torch.Generator().manual_seed(rt.shared_seed(7))

    def steps(omega, k):  # k full-data steps (every step streams all of this rank's batches)
        return D.learn_particles(ham, omega, D.LangevinSchedule(steps=k, eta=0.05, beta=1e4),
                                 itertools.repeat(batches), projection=D.Ball(6.0),
                                 generator=gen, comm=rt.comm)

    omega = steps(omega0, 2).omega  # warm-up
    with _Timer(rt) as timer:
        res = steps(omega, args.a_steps)
    return {**timer.row(), "steps": args.a_steps, "n": n, "N": m,
            "checksum": float(res.omega.double().sum()), "energy_last": res.trace[-1]["energy"]}


def _model_and_data(args, n: int):
    from coulomb_attention.nn.model import ModelConfig, TransformerClassifier
    from coulomb_attention.train.loop import EncodedDataset

    gen = torch.Generator().manual_seed(1)
    t = args.seq_len
    lengths = torch.randint(t // 2, t + 1, (n,), generator=gen)
    ids = torch.randint(4, args.vocab, (n, t), generator=gen)
    mask = torch.arange(t)[None] < lengths[:, None]
    ids = ids.masked_fill(~mask, 0)
    labels = ((ids < args.vocab // 2) & mask).sum(1).gt(lengths // 2).long()  # majority rule
    cfg = ModelConfig(vocab_size=args.vocab, dim=args.dim, layers=2, heads=4,
                      mlp_dim=2 * args.dim, max_len=t, n_features=args.b_features,
                      dropout=0.0)
    model = TransformerClassifier(cfg, generator=torch.Generator().manual_seed(2))
    return model, EncodedDataset(ids, mask, labels)


def _phase_a_model(rt, args) -> dict:
    from coulomb_attention.train.distributed import shard
    from coulomb_attention.train.phases import AlignConfig, align_features

    model, data = _model_and_data(args, args.am_examples)
    local = shard(data, rt.rank, rt.world_size, strided=True, equal=True)
    cfg = AlignConfig(n_examples=args.am_examples // rt.world_size, holdout=0,
                      batch_size=args.am_batch // rt.world_size, steps=args.am_steps)
    with _Timer(rt) as timer:
        records = align_features(model, local, cfg, generator=torch.Generator().manual_seed(3),
                                 comm=rt.comm)
    omega = torch.cat([layer.omega.flatten() for layer in model.attention_layers])
    return {**timer.row(), "steps": args.am_steps, "layers": len(records),
            "n": args.am_examples, "batch": args.am_batch,
            "checksum": float(omega.double().sum()),
            "alignment_after": [r["train_after"] for r in records]}


def _phase_b(rt, args) -> dict:
    from coulomb_attention.train.loop import TrainConfig, fit

    model, data = _model_and_data(args, args.b_examples)
    cfg = TrainConfig(epochs=1, batch_size=args.b_batch // rt.world_size, lr=1e-3,
                      warmup_fraction=0.0, schedule="constant")
    # warm-up step (DDP construction, allocator) outside the timed epoch
    warm, warm_data = _model_and_data(args, 4 * args.b_batch)
    fit(warm, warm_data, cfg, seed=0, runtime=rt)
    with _Timer(rt) as timer:
        res = fit(model, data, cfg, seed=0, runtime=rt)
    return {**timer.row(), "n": args.b_examples, "batch": args.b_batch,
            "steps": -(-args.b_examples // args.b_batch),
            "train_loss": res.history[-1]["train_loss"],
            "checksum": float(sum(p.detach().double().sum() for p in model.parameters()))}


WORKLOADS = {"phase_a_core": _phase_a_core, "phase_a_model": _phase_a_model,
             "phase_b": _phase_b}


def worker(args) -> None:
    from coulomb_attention.train.distributed import init_distributed

    torch.set_num_threads(args.threads)
    rt = init_distributed(timeout_s=600, progress=False)
    try:
        for name in args.workloads.split(","):
            load = os.getloadavg()[0]
            row = WORKLOADS[name](rt, args)
            if rt.is_main:
                row.update(workload=name, processes=rt.world_size, threads=args.threads,
                           load_1min_before=load, load_1min_after=os.getloadavg()[0])
                with open(args.result, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    finally:
        rt.close()


# ------------------------------------------------------------------------------ launcher


def launch(args, argv_rest: list[str]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = out / "results.jsonl"
    if result.exists():
        result.unlink()
    for spec in args.configs.split(","):
        procs, threads = (int(v) for v in spec.split("x"))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={procs}", __file__, "--worker", "--threads", str(threads),
               "--result", str(result), *argv_rest]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        print(f"== {procs} process(es) x {threads} thread(s): {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, env=env, check=True, timeout=args.timeout)
    rows = [json.loads(line) for line in result.read_text().splitlines()]
    lines = ["| workload | processes x threads | wall (s) | wall speed-up vs 1x1 | vs 1x2 "
             "| CPU s per rank | CPU-time speed-up vs 1x1 | checksum | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in WORKLOADS:
        sel = [r for r in rows if r["workload"] == name]
        base = {(r["processes"], r["threads"]): r for r in sel}
        nan = {"time_s": float("nan"), "cpu_s_per_rank": [float("nan")]}
        for r in sel:
            s11 = base.get((1, 1), nan)["time_s"] / r["time_s"]
            s12 = base.get((1, 2), nan)["time_s"] / r["time_s"]
            # critical-path CPU time: what the wall speed-up would be without other load
            c11 = (base.get((1, 1), nan)["cpu_s_per_rank"][0] / max(r["cpu_s_per_rank"])
                   if r["threads"] == 1 else float("nan"))
            cpu = "/".join(f"{c:.2f}" for c in r["cpu_s_per_rank"])
            lines.append(f"| {name} | {r['processes']}x{r['threads']} | {r['time_s']:.2f} | "
                         f"{s11:.2f} | {s12:.2f} | {cpu} | {c11:.2f} | {r['checksum']:.6g} | "
                         f"{r['load_1min_before']:.1f} -> {r['load_1min_after']:.1f} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"-> {result}, {out / 'summary.md'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/bench_distributed")
    p.add_argument("--configs", default="1x1,1x2,2x1",
                   help="comma-separated PROCESSESxTHREADS (per process)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--timeout", type=int, default=900, help="seconds per configuration")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    # workload sizes
    p.add_argument("--a-examples", type=int, default=16384)
    p.add_argument("--a-features", type=int, default=256)
    p.add_argument("--a-steps", type=int, default=10)
    p.add_argument("--am-examples", type=int, default=2048)
    p.add_argument("--am-batch", type=int, default=256)
    p.add_argument("--am-steps", type=int, default=20)
    p.add_argument("--b-examples", type=int, default=2048)
    p.add_argument("--b-batch", type=int, default=32)
    p.add_argument("--b-features", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--vocab", type=int, default=1000)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    rest = []
    for action in p._actions:
        if action.dest in ("out", "configs", "timeout", "worker", "threads", "result", "help"):
            continue
        rest += [action.option_strings[0], str(getattr(args, action.dest))]
    launch(args, rest)


if __name__ == "__main__":
    main()
