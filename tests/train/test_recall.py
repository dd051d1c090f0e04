"""The no-mixing control, the causal recall model, the token-pair data term, one recall run."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention import features
from coulomb_attention.energy.token_pair import (
    TokenPairAlignment,
    token_pair_alignment_naive,
    token_pair_stats,
)
from coulomb_attention.nn import KernelAttention
from coulomb_attention.nn.attention import ATTENTION_FEATURES
from coulomb_attention.nn.recall import RecallModel, RecallModelConfig
from helpers import finite_diff_grad

# ---------------------------------------------------------------- attention "none"


@pytest.mark.parametrize("causal", [False, True])
def test_none_attention_mixes_no_tokens(causal):
    torch.manual_seed(0)
    layer = KernelAttention(16, 2, "none", causal=causal).double()
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    mask = torch.ones(3, 7, dtype=torch.bool)
    y = layer(x, mask)
    # it is exactly out_proj(v_proj(x)) per token
    assert torch.allclose(y, layer.out_proj(layer.v_proj(x)), atol=1e-12)
    for j in range(7):
        x2 = x.clone()
        x2[:, j] += torch.randn(3, 16, dtype=torch.float64)
        y2 = layer(x2, mask)
        changed = (y2 - y).abs().amax(dim=(0, 2)) > 1e-12  # (T,)
        assert changed.tolist() == [i == j for i in range(7)]


def test_none_attention_has_no_particles():
    assert not ATTENTION_FEATURES["none"].has_features
    layer = KernelAttention(8, 2, "none", n_features=16)
    assert layer.omega.shape == (1, 0, 4)
    with pytest.raises(ValueError, match="no particles"):
        layer.load_features_(torch.zeros(16, 4))
    with pytest.raises(ValueError, match="no feature map"):
        layer.feature(torch.zeros(2, 4), torch.zeros(3, 4))


def test_a_softmax_layer_does_mix_tokens():
    # the control above could pass vacuously if the probe were blind: it is not
    torch.manual_seed(0)
    layer = KernelAttention(16, 2, "softmax").double()
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    y = layer(x)
    x2 = x.clone()
    x2[:, 4] += 1.0
    assert (layer(x2) - y)[:, :4].abs().max() > 1e-6


# ---------------------------------------------------------------- the recall model


@pytest.mark.parametrize("attention", ["softmax", "favor", "porf_softplus", "softmax_feat",
                                       "elu", "none"])
def test_recall_model_is_causal(attention):
    torch.manual_seed(0)
    cfg = RecallModelConfig(vocab_size=20, max_len=12, dim=16, heads=2, layers=2, mlp_dim=8,
                            attention=attention, n_features=8, positions=True)
    model = RecallModel(cfg, generator=0).double().eval()
    ids = torch.randint(20, (2, 12))
    out = model(ids)
    assert out.shape == (2, 12, 20)
    for t in range(11):
        ids2 = ids.clone()
        ids2[:, t + 1:] = torch.randint(20, (2, 11 - t))
        assert torch.allclose(model(ids2)[:, :t + 1], out[:, :t + 1], atol=1e-10), t


def test_recall_model_without_mixing_sees_only_its_token_and_the_previous_one():
    torch.manual_seed(0)
    cfg = RecallModelConfig(vocab_size=20, max_len=10, dim=16, heads=2, layers=2,
                            attention="none")
    model = RecallModel(cfg).double().eval()
    ids = torch.randint(20, (1, 10))
    out = model(ids)
    ids2 = ids.clone()
    ids2[0, 3] = (ids[0, 3] + 1) % 20
    changed = (model(ids2) - out).abs().amax(-1)[0] > 1e-12
    assert changed.tolist() == [t in (3, 4) for t in range(10)]


# ---------------------------------------------------------------- token-pair data term


def _pair_batch(gen, B=2, H=2, R=3, S=6, d=3, dtype=torch.float64):
    q = 0.7 * torch.randn(B, H, R, d, generator=gen, dtype=dtype)
    k = 0.7 * torch.randn(B, H, S, d, generator=gen, dtype=dtype)
    pos = torch.tensor([2, 4, 5])  # query rows at these positions: causal keys s <= pos
    valid = (torch.arange(S)[None, :] <= pos[:, None]).expand(B, R, S).clone()
    valid[1, :, 0] = False  # a padded key
    tgt = torch.zeros(B, R, S, dtype=dtype)
    for b in range(B):
        for r in range(R):
            s = int(torch.randint(1, int(pos[r]) + 1, (1,), generator=gen))
            tgt[b, r, s] = 1.0
    return (q, k, valid), tgt


@pytest.mark.parametrize("feature", [features.positive, features.softplus])
@pytest.mark.parametrize("center", [True, False])
def test_token_pair_alignment_matches_naive_twin_and_finite_differences(feature, center):
    gen = torch.Generator().manual_seed(0)
    batches = [_pair_batch(gen), _pair_batch(gen)]
    omega = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    term = TokenPairAlignment(feature, center=center)
    value, grad, info = term.value_and_grad(omega, batches)
    w = omega.clone().requires_grad_(True)
    naive = token_pair_alignment_naive(feature, w, batches, center=center)
    (naive_grad,) = torch.autograd.grad(naive, w)
    assert abs(float(value) + float(naive.detach())) < 1e-12
    assert abs(info["alignment"] - float(naive.detach())) < 1e-12
    assert torch.allclose(grad, -naive_grad, rtol=1e-9, atol=1e-12)
    # central finite differences of the energy
    fd = finite_diff_grad(lambda w: term.value_and_grad(w, batches)[0], omega)
    assert torch.allclose(grad, fd, rtol=1e-5, atol=1e-8)
    # the value does not depend on how the data is batched
    joined = [((torch.cat([b[0][0] for b in batches]), torch.cat([b[0][1] for b in batches]),
                torch.cat([b[0][2] for b in batches])), torch.cat([b[1] for b in batches]))]
    v2, g2, _ = term.value_and_grad(omega, joined)
    assert abs(float(v2 - value)) < 1e-12 and torch.allclose(g2, grad, atol=1e-12)


def test_token_pair_alignment_is_finite_at_float32_overflow_norms():
    """float32 inputs whose unshifted FAVOR+ features overflow float32 (exp(|w|^2/2) with
    |w| ~ 20): the term computes in float64, so value and gradient stay finite and equal
    the float64 twin (phase A of FAVOR+ M = 128 at the MQAR hard level hit NaN energies)."""
    gen = torch.Generator().manual_seed(3)
    (q, k, valid), tgt = _pair_batch(gen, dtype=torch.float32)
    omega = torch.randn(6, 3, generator=gen)
    omega = 20.0 * omega / omega.norm(dim=-1, keepdim=True)
    q, k = 6.0 * q, 6.0 * k
    assert not torch.isfinite(features.positive(q.double(), omega.double()).float()).all()
    value, grad, _ = TokenPairAlignment(features.positive).value_and_grad(
        omega, [((q, k, valid), tgt)])
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    w = omega.double().requires_grad_(True)
    naive = token_pair_alignment_naive(
        features.positive, w, [((q.double(), k.double(), valid), tgt.double())])
    assert abs(float(value) + float(naive.detach())) < 1e-6


def test_token_pair_alignment_is_one_for_attention_on_the_target():
    # a kernel that is (numerically) zero off the target: P = Y, so A = 1
    q = torch.zeros(1, 1, 2, 2, dtype=torch.float64)
    k = torch.zeros(1, 1, 3, 2, dtype=torch.float64)
    q[0, 0, 0, 0] = q[0, 0, 1, 1] = 1.0
    k[0, 0, 1, 0] = k[0, 0, 2, 1] = 1.0

    def onehot(u, omega):  # "features" that are u itself: k(t, s) = q_t . k_s
        return u + 1e-300

    valid = torch.ones(1, 2, 3, dtype=torch.bool)
    target = torch.zeros(1, 2, 3, dtype=torch.float64)
    target[0, 0, 1] = target[0, 1, 2] = 1.0
    stats = token_pair_stats(onehot, torch.zeros(2, 2), (q, k, valid), target)
    assert abs(float(stats[0] / (stats[1] * stats[2]).sqrt()) - 1.0) < 1e-12
    target2 = torch.zeros_like(target)
    target2[0, 0, 0] = target2[0, 1, 0] = 1.0  # the wrong keys: negative alignment
    stats = token_pair_stats(onehot, torch.zeros(2, 2), (q, k, valid), target2)
    assert float(stats[0]) < 0


# ---------------------------------------------------------------- one run, the command


def _tiny(**over):
    from coulomb_attention.config import from_dict
    from coulomb_attention.train.recall import RecallRunConfig

    base = {"task": {"vocab_size": 16, "n_pairs": 3, "seq_len": 12, "n_queries": 2},
            "model": {"vocab_size": 16, "max_len": 12, "dim": 16, "heads": 2, "mlp_dim": 16,
                      "attention": "favor", "n_features": 8},
            "train": {"epochs": 1, "batch_size": 32, "length_grouping": 0},
            "align": {"n_examples": 64, "holdout": 32, "batch_size": 32, "steps": 10},
            "n_train": 64, "n_eval": 32, "warmup_epochs": 1}
    base.update(over)
    return from_dict(RecallRunConfig, base)


def test_learned_phase_a_raises_the_token_pair_alignment():
    from coulomb_attention.train.recall import run_recall

    row = run_recall(_tiny(kernel="learned", seed=1))
    assert {"attention", "kernel", "n_features", "seed", "accuracy", "config"} <= set(row)
    assert row["config"]["kernel"] == "learned" and 0 <= row["accuracy"] <= 1
    (rec,) = row["alignment"]  # one omega group (shared by the heads of the last layer)
    assert rec["train_after"] > rec["train_before"] and rec["omega_shift"] > 0
    with pytest.raises(ValueError, match="no particles"):
        _tiny(kernel="learned", model={"vocab_size": 16, "max_len": 12, "attention": "none"})


def test_recall_command_skips_finished_runs(tmp_path, monkeypatch):
    import json

    from coulomb_attention.train import recall as lib

    calls = []

    def fake(cfg, progress=False, teacher_dir=None):
        calls.append(cfg)
        return {"attention": cfg.model.attention, "kernel": cfg.kernel,
                "n_features": cfg.model.n_features, "seed": cfg.seed, "accuracy": 0.5,
                "chance": cfg.task.chance, "config": lib.to_dict(cfg)}

    monkeypatch.setattr(lib, "run_recall", fake)  # the command imports it when it runs
    argv = ["recall", "--out", str(tmp_path), "--levels", "easy", "--attentions",
            "softmax,favor", "--kernels", "vanilla,learned", "--n-features", "4,16",
            "--seeds", "0"]
    from coulomb_attention.cli import main

    assert main(argv) == 0
    assert len(calls) == 5  # softmax once; favor 2 M x 2 kernels
    assert main(argv) == 0 and len(calls) == 5  # nothing re-run
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and (tmp_path / "summary.md").exists()
    assert (tmp_path / "accuracy_vs_M.png").stat().st_size > 0
    # an unknown kernel is a one-line error before any run starts
    bad = [a if a != "vanilla,learned" else "vanilla,nope" for a in argv]
    assert main([*bad, "--seeds", "5"]) == 2 and len(calls) == 5
    # the command module itself imports no torch (--help stays fast)
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", "import sys, coulomb_attention.commands.recall; "
                            "print('torch' in sys.modules)"], capture_output=True, text=True)
    assert probe.stdout.strip() == "False", probe.stderr


def test_recall_report_keeps_the_latest_row_of_a_rerun():
    from coulomb_attention.reports.recall import latest_runs

    def row(acc, epochs, seed=0):
        return {"level": "hard", "attention": "softmax", "kernel": "vanilla", "n_features": 64,
                "seed": seed, "accuracy": acc, "config": {"train": {"epochs": epochs}}}

    rows, superseded = latest_runs([row(0.61, 4), row(0.98, 12), row(0.99, 12, seed=1)])
    assert superseded == 1
    assert sorted(r["accuracy"] for r in rows) == [0.98, 0.99]


def test_a_diverged_run_is_recorded_and_the_grid_goes_on(tmp_path, monkeypatch, capsys):
    import json

    from coulomb_attention.cli import main
    from coulomb_attention.train import recall as lib

    def fake(cfg, progress=False, teacher_dir=None):
        if cfg.model.n_features == 8:
            raise FloatingPointError("non-finite training loss (nan) at epoch 7, step 529")
        return {"attention": cfg.model.attention, "kernel": cfg.kernel,
                "n_features": cfg.model.n_features, "seed": cfg.seed, "accuracy": 0.5,
                "chance": cfg.task.chance, "config": lib.to_dict(cfg)}

    monkeypatch.setattr(lib, "run_recall", fake)
    argv = ["recall", "--out", str(tmp_path), "--levels", "easy", "--attentions", "favor",
            "--kernels", "vanilla", "--n-features", "8,16", "--seeds", "0"]
    assert main(argv) == 0
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["n_features"], r["accuracy"]) for r in rows] == [(8, None), (16, 0.5)]
    assert "DIVERGED (non-finite training loss" in capsys.readouterr().out
    summary = (tmp_path / "summary.md").read_text()
    assert "## Diverged runs" in summary and "easy favor-vanilla M=8 seed=0" in summary
    assert main(argv) == 0  # a diverged run is done: not re-run
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2
