"""Data-parallel training equals one process (CPU, gloo, 2 processes launched by torchrun).

One torchrun launch (module fixture) runs every distributed case of this file in script mode
(``python -m torch.distributed.run --standalone --nproc-per-node=2 tests/train/test_distributed.py
OUT``); each rank saves its results, and the tests compare them with the same computation done
here in one process. The launch has a timeout, so a hung collective cannot hang CI.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coulomb_attention import dynamics as D
from coulomb_attention import energy as E
from coulomb_attention import features as F
from coulomb_attention._validation import torch_generator
from coulomb_attention.train import distributed as dd
from coulomb_attention.train.loop import Runtime

WORLD = 2
LAUNCH_TIMEOUT_S = 150
GLOBAL_BATCH = 4  # phase B: 12 examples, 3 steps of 4 (2 per rank) per epoch, 2 epochs


@pytest.fixture(autouse=True)
def _one_thread():
    # The in-process references are tiny; with several intra-op threads on a loaded 2-core
    # machine they run 10-30x slower (spinning threads). Restored after each test.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# ------------------------------------------------------------------------- shared problems


def _phase_a_problem():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(67, 3, generator=gen, dtype=torch.float64)  # 67: uneven shards
    y, _ = E.encode_labels((x[:, 0] * x[:, 1] > 0).long().numpy())
    omega0 = F.gaussian(24, 3, generator=gen, dtype=torch.float64)
    bias = F.draw_bias(24, generator=gen, dtype=torch.float64)
    return x, y, omega0, F.feature_fn("rff", bias=bias)


def run_phase_a(rank: int, world: int, reduce, *, sharded_repulsion: bool = False,
                n_steps: int = 12) -> tuple[torch.Tensor, list[float]]:
    """Projected Langevin (noisy, full-batch) on this rank's shard; returns particles, energies."""
    x, y, omega0, feats = _phase_a_problem()
    xs, ys = dd.shard((x, y), rank, world)
    batches = [(xs[i:i + 16], ys[i:i + 16]) for i in range(0, xs.shape[0], 16)]  # streamed
    pot = E.make_potential("riesz", s=1.0, eps=0.1)
    ham = E.Hamiltonian(E.LabelAlignment(feats), pot, lam=0.05, shard_pairs=sharded_repulsion)
    comm = None if reduce is None else E.Comm(reduce, rank, world)
    full_batch = itertools.repeat(batches)  # every step streams all of this rank's batches
    res = D.learn_particles(ham, omega0, D.LangevinSchedule(steps=n_steps, eta=0.05, beta=200.0),
                            full_batch, projection=D.Ball(3.0),
                            generator=torch_generator(dd.shared_seed(1234)), comm=comm)
    return res.omega, [t["energy"] for t in res.trace]


def _phase_b_data(n: int = 12):
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(3, 9, (n,), generator=gen)
    ids = torch.randint(1, 40, (n, 8), generator=gen)
    mask = torch.arange(8)[None] < lengths[:, None]
    ids = ids.masked_fill(~mask, 0)
    labels = torch.randint(0, 2, (n,), generator=gen)
    return ids, mask, labels


def run_phase_b(runtime, global_batch: int, epochs: int = 2, checkpoint_dir=None,
                resume: bool = False, stop_after: int | None = None, schedule="constant"):
    """Fine-tune a tiny classifier with the training loop (batch per process:
    ``global_batch / world_size``); returns its state dict and history."""
    from coulomb_attention.nn.model import ModelConfig, TransformerClassifier
    from coulomb_attention.train.loop import EncodedDataset, TrainConfig, fit

    ids, mask, labels = _phase_b_data()
    cfg = ModelConfig(vocab_size=40, dim=16, layers=1, heads=2, mlp_dim=32, max_len=8,
                      n_features=8, dropout=0.0)
    model = TransformerClassifier(cfg, generator=torch.Generator().manual_seed(5))
    # no length grouping: it groups each process's share (see docs/distributed.md)
    extra = {"length_grouping": 0} if "length_grouping" in TrainConfig.__dataclass_fields__ else {}
    tcfg = TrainConfig(epochs=epochs, batch_size=global_batch // runtime.world_size, lr=1e-2,
                       grad_clip=1.0, schedule=schedule, **extra,
                       warmup_fraction=0.0 if schedule == "constant" else 0.2)
    result = fit(model, EncodedDataset(ids, mask, labels), tcfg, seed=11, runtime=runtime,
                 checkpoint_dir=checkpoint_dir, resume=resume, stop_after=stop_after,
                 run_config={"test": 1})
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, result.history


def run_align_features(rank: int, world: int, reduce) -> torch.Tensor:
    """Phase A of the training code (``align_features``) with full-batch steps on this rank's
    shard of 12 sequences; returns the particles of the model's attention layer."""
    from coulomb_attention.nn.model import ModelConfig, TransformerClassifier
    from coulomb_attention.train.loop import EncodedDataset
    from coulomb_attention.train.phases import AlignConfig, align_features

    ids, mask, labels = _phase_b_data()
    labels = torch.arange(12) // 2 % 2  # both classes in every strided shard
    data = dd.shard(EncodedDataset(ids, mask, labels), rank, world, strided=True, equal=True)
    cfg = ModelConfig(vocab_size=40, dim=16, layers=1, heads=2, mlp_dim=32, max_len=8,
                      n_features=8, dropout=0.0)
    model = TransformerClassifier(cfg, generator=torch.Generator().manual_seed(5))
    # beta=0: no noise. align_features draws its noise after randperm(n_examples) from one
    # generator, so one process (12 examples) and a shard (6) see different noise streams;
    # equal shards keep the streams equal across ranks.
    align = AlignConfig(n_examples=64, holdout=0, batch_size=64, steps=6, eta=0.5, eta_end=0.1,
                        beta=0.0, lam=0.1)
    align_features(model, data, align, generator=torch.Generator().manual_seed(9),
                   comm=None if reduce is None else E.Comm(reduce, rank, world))
    return model.attention_layers[0].omega.detach().clone()


# ----------------------------------------------------------------- the distributed worker


def _worker(out: Path) -> None:
    rt = dd.init_distributed(timeout_s=60, progress=False)
    assert rt.world_size == WORLD and rt.backend == "gloo"
    res: dict[str, torch.Tensor] = {}
    # all_reduce_sum: mixed dtypes, 0-d tensors, inputs untouched
    a = torch.full((2, 3), float(rt.rank + 1), dtype=torch.float64)
    b = torch.tensor(rt.rank + 1.0)
    c = torch.arange(4, dtype=torch.float32) * (rt.rank + 1)
    ra, rb, rc = dd.all_reduce_sum([a, b, c])
    res.update(reduce_a=ra, reduce_b=rb, reduce_c=rc, reduce_a_input=a)
    # phase A on the core: shards + reduce hook + shared noise seed
    omega, energies = run_phase_a(rt.rank, rt.world_size, rt.reduce)
    res.update(phase_a=omega, phase_a_energy=torch.tensor(energies))
    omega, _ = run_phase_a(rt.rank, rt.world_size, rt.reduce, sharded_repulsion=True)
    res["phase_a_sharded"] = omega
    res["align_features"] = run_align_features(rt.rank, rt.world_size, rt.reduce)
    # sharded Riesz alone, N odd (uneven rows)
    w = torch.randn(7, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pot = E.make_potential("riesz", s=1.0, eps=0.05)
    energy, grad = E.sharded_riesz_energy_and_grad(w, pot, rt.rank, rt.world_size, rt.reduce)
    res.update(riesz_energy=energy, riesz_grad=grad)
    # phase B: 2 epochs x 3 DDP steps, constant and warm-up + linear learning rate
    for schedule in ("constant", "linear"):
        state, hist = run_phase_b(rt, GLOBAL_BATCH, schedule=schedule)
        res.update({f"{schedule}.{k}": v for k, v in state.items()})
        res[f"{schedule}_loss"] = torch.tensor([h["train_loss"] for h in hist])
    # phase B: stop after epoch 1 + resume (rank-0 checkpoints) vs the uninterrupted run
    run_phase_b(rt, GLOBAL_BATCH, checkpoint_dir=out / "ck", stop_after=1)
    resumed, hist_res = run_phase_b(rt, GLOBAL_BATCH, checkpoint_dir=out / "ck", resume=True)
    res.update({f"resumed.{k}": v for k, v in resumed.items()})
    res["resumed_loss"] = torch.tensor([h["train_loss"] for h in hist_res])
    torch.save(res, out / f"rank{rt.rank}.pt")
    rt.barrier()
    rt.close()


@pytest.fixture(scope="module")
def dist_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={WORLD}", __file__, str(out)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:  # the process group is killed with it
        pytest.fail(f"torchrun did not finish in {LAUNCH_TIMEOUT_S} s: {exc.stderr!s:.2000}")
    if proc.returncode != 0:
        pytest.fail(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-6000:]}")
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)], out


# ----------------------------------------------------------------------------------- tests


def test_all_reduce_sum(dist_results):
    ranks, _ = dist_results
    for r in ranks:
        assert torch.equal(r["reduce_a"], torch.full((2, 3), 3.0, dtype=torch.float64))
        assert r["reduce_b"].shape == () and float(r["reduce_b"]) == 3.0
        assert r["reduce_c"].dtype == torch.float32
        assert torch.equal(r["reduce_c"], torch.arange(4, dtype=torch.float32) * 3)
    assert torch.equal(ranks[1]["reduce_a_input"], torch.full((2, 3), 2.0, dtype=torch.float64))


@pytest.mark.parametrize("key", ["phase_a", "phase_a_sharded"])
def test_phase_a_matches_single_process(dist_results, key):
    ranks, _ = dist_results
    single, energies = run_phase_a(0, 1, None)
    assert (single - _phase_a_problem()[2]).norm() > 0.1  # the particles really moved
    # replicated particles stay bit-identical across ranks (same reduced grad, same noise)
    assert torch.equal(ranks[0][key], ranks[1][key])
    torch.testing.assert_close(ranks[0][key], single, rtol=1e-9, atol=1e-10)
    if key == "phase_a":
        torch.testing.assert_close(ranks[0]["phase_a_energy"], torch.tensor(energies),
                                   rtol=1e-9, atol=1e-12)


def test_align_features_matches_single_process(dist_results):
    # the training code's phase A with full-batch steps: 2 shards + reduce == all data
    ranks, _ = dist_results
    single = run_align_features(0, 1, None)
    init = _initial_state()["blocks.0.attn.omega"]
    assert float((single - init).abs().max()) > 1e-3  # the particles moved
    assert torch.equal(ranks[0]["align_features"], ranks[1]["align_features"])
    torch.testing.assert_close(ranks[0]["align_features"], single, rtol=1e-4, atol=1e-5)


def test_phase_a_differs_without_reduce():
    # the check above can fail: a rank that sees only its shard moves elsewhere
    single, _ = run_phase_a(0, 1, None)
    shard_only, _ = run_phase_a(0, 2, None)
    assert (single - shard_only).norm() > 1e-3


@pytest.mark.parametrize("n, world", [(7, 2), (7, 3), (2, 3), (10, 4)])
def test_sharded_riesz_equals_core(n, world):
    w = torch.randn(n, 3, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    pot = E.make_potential("riesz", s=1.5, eps=0.05)
    parts = [E.sharded_riesz_energy_and_grad(w, pot, r, world, reduce=lambda t: t)
             for r in range(world)]
    energy = sum(p[0] for p in parts)
    grad = sum(p[1] for p in parts)
    torch.testing.assert_close(energy, E.riesz_energy(w, pot), rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, E.riesz_grad(w, pot), rtol=1e-10, atol=1e-12)


def test_sharded_riesz_distributed(dist_results):
    ranks, _ = dist_results
    w = torch.randn(7, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pot = E.make_potential("riesz", s=1.0, eps=0.05)
    for r in ranks:
        torch.testing.assert_close(r["riesz_energy"], E.riesz_energy(w, pot), rtol=1e-12, atol=0)
        torch.testing.assert_close(r["riesz_grad"], E.riesz_grad(w, pot), rtol=1e-10,
                                   atol=1e-12)


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_phase_b_matches_single_process(dist_results, schedule):
    # 6 DDP steps on 2 x 2 examples == 6 steps on the concatenated batches of 4, in one process
    ranks, _ = dist_results
    single, hist = run_phase_b(Runtime(progress=False), GLOBAL_BATCH, schedule=schedule)
    init = _initial_state()
    moved = 0.0
    for k, v in single.items():
        a, b = ranks[0][f"{schedule}.{k}"], ranks[1][f"{schedule}.{k}"]
        assert torch.equal(a, b), k  # DDP keeps the replicas identical
        torch.testing.assert_close(a, v, rtol=1e-4, atol=1e-5, msg=k)
        moved = max(moved, float((v.double() - init[k].double()).abs().max()))
    assert moved > 1e-2  # training changed the parameters
    torch.testing.assert_close(ranks[0][f"{schedule}_loss"],
                               torch.tensor([h["train_loss"] for h in hist]), rtol=1e-5, atol=0)


def _initial_state():
    from coulomb_attention.nn.model import ModelConfig, TransformerClassifier

    cfg = ModelConfig(vocab_size=40, dim=16, layers=1, heads=2, mlp_dim=32, max_len=8,
                      n_features=8, dropout=0.0)
    return TransformerClassifier(cfg, generator=torch.Generator().manual_seed(5)).state_dict()


def test_phase_b_resume_is_exact(dist_results):
    ranks, out = dist_results
    for r in ranks:
        full = {k[len("constant."):]: v for k, v in r.items() if k.startswith("constant.")}
        assert full
        for k, v in full.items():
            assert torch.equal(r[f"resumed.{k}"], v), k
        assert torch.equal(r["resumed_loss"], r["constant_loss"])
    assert torch.equal(ranks[0]["constant_loss"], ranks[1]["constant_loss"])  # all-reduced
    assert (out / "ck" / "latest.json").is_file()  # written by rank 0


def test_init_distributed_single_process(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    rt = dd.init_distributed()
    assert (rt.rank, rt.world_size, rt.backend, rt.is_main) == (0, 1, None, True)
    model = torch.nn.Linear(2, 2)
    assert rt.wrap(model) is model
    assert rt.reduce is None
    x = [torch.ones(2)]
    assert dd.all_reduce_sum(x)[0] is x[0]


def test_bad_input_raises(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert dd.env_info() == (0, 0, 1)  # a stray LOCAL_RANK alone: one process
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK and WORLD_SIZE"):
        dd.env_info()
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="inconsistent"):
        dd.env_info()
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ValueError, match="backend"):
        dd.init_distributed(backend="mpi")
    with pytest.raises(ValueError, match="cannot shard 1 examples over 2"):
        dd.shard_indices(1, 0, 2)
    with pytest.raises(ValueError, match="rank"):
        dd.shard_indices(5, 2, 2)
    with pytest.raises(TypeError, match="cannot shard"):
        dd.shard({"a": 1}, 0, 2)
    with pytest.raises(TypeError, match="tensors"):
        dd.all_reduce_sum([1.0])
    with pytest.raises(ValueError, match="empty"):
        dd.ShardedEpochSampler([], torch.Generator(), 0, 2)


@pytest.mark.parametrize("n, world, local", [(12, 2, 2), (11, 2, 2), (10, 3, 3), (2, 3, 1)])
def test_sharded_sampler_partitions_single_process_batches(n, world, local):
    data = list(range(n))
    single = list(torch.utils.data.RandomSampler(data, generator=torch.Generator().manual_seed(1)))
    gens = [torch.Generator().manual_seed(1) for _ in range(world)]
    shares = [list(dd.ShardedEpochSampler(data, gens[r], r, world)) for r in range(world)]
    assert all(len(s) == -(-n // world) for s in shares)  # ceil(n / W) each: same steps
    padded = (single * world)[: len(shares[0]) * world]  # wrap-around padding
    for j in range(0, len(shares[0]), local):  # one step: every rank's next local batch
        step = sorted(sum((s[j:j + local] for s in shares), []))
        assert step == sorted(padded[j * world:(j + local) * world])
    # a given global order (e.g. length-grouped) is dealt out the same way
    given = [list(dd.ShardedEpochSampler(data, None, r, world, order=single)) for r in range(world)]
    assert given == shares
    # the generator advanced exactly as in one process
    ref = torch.Generator().manual_seed(1)
    list(torch.utils.data.RandomSampler(data, generator=ref))
    assert torch.equal(gens[0].get_state(), ref.get_state())


def test_shard_modes():
    from coulomb_attention.train.loop import EncodedDataset

    x = torch.arange(7)
    assert dd.shard(x, 1, 2).tolist() == [4, 5, 6]
    assert dd.shard(x, 1, 2, strided=True).tolist() == [1, 3, 5]
    assert dd.shard(x, 0, 2, strided=True, equal=True).tolist() == [0, 2, 4]
    assert dd.shard(x, 1, 2, equal=True).tolist() == [3, 4, 5]
    ds = EncodedDataset(torch.ones(5, 3, dtype=torch.long), torch.ones(5, 3, dtype=torch.bool),
                        torch.arange(5))
    part = dd.shard(ds, 1, 2, strided=True)
    assert isinstance(part, EncodedDataset) and part.labels.tolist() == [1, 3]
    assert dd.shard((x, x * 2), 0, 3)[1].tolist() == [0, 2, 4]


def test_shards_partition():
    for n, world in [(5, 2), (67, 2), (9, 4), (4, 4)]:
        parts = [list(dd.shard_indices(n, r, world)) for r in range(world)]
        assert sum(parts, []) == list(range(n))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
