"""Joint refinement of a converted encoder: the embedding data term against direct formulas and
finite differences, its exact all-reduce, and the refinement moving only the particles."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention.convert.distill import (
    DistillConfig,
    _ParticlesOf,
    distill_attention,
    refine_encoder,
)
from coulomb_attention.energy import Comm, EmbeddingTeacher
from coulomb_attention.nn.families.bert import load_pretrained_encoder, load_pretrained_tokenizer
from helpers import finite_diff_grad
from test_convert import SENTENCES
from test_pretrained import write_tiny_bert


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert-refine"), qk_scale=4.0)


@pytest.fixture(scope="module")
def batch(tiny_dir):
    return load_pretrained_tokenizer(tiny_dir).encode_batch(SENTENCES, max_length=16)


_MIX = torch.randn(6, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def _toy_embed(omega, x):
    """A smooth map of inputs (B, 4) through all 6 particles (any layout), float64."""
    return torch.tanh(x @ omega.reshape(-1, x.shape[1]).T) @ _MIX


def _toy_batches(n=2):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 4, generator=g, dtype=torch.float64),
             torch.randn(5, 3, generator=g, dtype=torch.float64)) for _ in range(n)]


def test_embedding_term_value_and_gradient():
    omega = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    batches = _toy_batches()
    term = EmbeddingTeacher(_toy_embed)

    def direct(w):
        e = torch.cat([_toy_embed(w, x) for x, _ in batches])
        t = torch.cat([y for _, y in batches])
        cos = (e * t).sum(1) / (e.norm(dim=1) * t.norm(dim=1))
        return (1 - cos).mean()

    value, grad, info = term.value_and_grad(omega, batches)
    assert float(value) == pytest.approx(float(direct(omega)), rel=1e-12)
    assert info["cos"] == pytest.approx(1 - float(value)) and info["sentences"] == 10
    assert grad.shape == omega.shape
    torch.testing.assert_close(grad, finite_diff_grad(direct, omega), rtol=1e-6, atol=1e-8)
    assert term.evaluate(omega, batches)["cos"] == pytest.approx(info["cos"], rel=1e-12)


def test_embedding_term_all_reduce_of_shards_equals_the_whole():
    omega = torch.randn(6, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    batches = _toy_batches(3)
    term = EmbeddingTeacher(_toy_embed)
    whole = term.value_and_grad(omega, batches)
    shards = [batches[:1], batches[1:]]
    stats = [term.sums(omega, s) for s in shards]
    for r in range(2):
        def reduce(tensors, r=r):  # a simulated all-reduce over the two ranks
            other = stats[1 - r]
            return [t + o for t, o in zip(tensors, other, strict=True)]
        v, g, _ = term.value_and_grad(omega, shards[r], Comm(reduce, rank=r, world_size=2))
        assert float(v) == pytest.approx(float(whole[0]), rel=1e-12)
        torch.testing.assert_close(g, whole[1])


def test_embedding_term_gradient_through_the_encoder(tiny_dir, batch):
    """The gradient in every layer's particles through a real (tiny, float64) encoder."""
    ids, mask = batch
    model = load_pretrained_encoder(tiny_dir, "favor", 4, share_features=False,
                                    generator=0).double()
    teacher = load_pretrained_encoder(tiny_dir, "softmax").double()
    with torch.no_grad():
        target = teacher.sentence_embedding(ids[:4], mask[:4])
    layers = model.attention_layers
    embed = _ParticlesOf(model, layers)
    omega = torch.cat([layer.omega.detach() for layer in layers])  # (L H, M, dh)
    term = EmbeddingTeacher(embed)
    _, grad, _ = term.value_and_grad(omega, [((ids[:4], mask[:4]), target)])
    fd = finite_diff_grad(lambda w: term.evaluate(w, [((ids[:4], mask[:4]), target)])["cos"]
                          * -1.0, omega)
    torch.testing.assert_close(grad, fd, rtol=1e-5, atol=1e-7)
    # the stored particles are untouched by the evaluations
    torch.testing.assert_close(torch.cat([layer.omega for layer in layers]), omega)


def test_particle_swap_restores_the_buffers_on_error(tiny_dir):
    model = load_pretrained_encoder(tiny_dir, "favor", 4, share_features=False, generator=0)
    saved = [layer.omega for layer in model.attention_layers]
    embed = _ParticlesOf(model, model.attention_layers)
    with pytest.raises(ValueError):
        embed(torch.zeros(4, 4, 8), (torch.zeros(2, 3, 2, dtype=torch.long), None))
    assert all(a is b for a, b in zip(saved, [la.omega for la in model.attention_layers],
                                      strict=True))


def _cfg(**kw):
    base = dict(n_examples=9, holdout=3, batch_size=3, rows_per_sequence=0, steps=20,
                eta=0.1, eta_end=0.02, beta=0, refine_steps=30, refine_eta=0.5,
                refine_eta_end=0.05, refine_max_drift=0.1)
    return DistillConfig(**{**base, **kw})


def test_refinement_raises_embedding_cosine_and_moves_only_particles(tiny_dir, batch):
    ids, mask = batch
    model = load_pretrained_encoder(tiny_dir, "favor", 8, share_features=False, generator=0)
    teacher = load_pretrained_encoder(tiny_dir, "softmax")
    cfg = _cfg()
    distill_attention(model, ids, mask, cfg, generator=torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rec = refine_encoder(model, teacher, ids, mask, cfg,
                         generator=torch.Generator().manual_seed(0))
    assert rec["stage"] == "refine" and rec["steps"] == 30 and rec["layers"] == 2
    assert rec["n_fit"] == 9 and rec["n_holdout"] == 3
    assert rec["cos_after"] > rec["cos_before"], rec
    assert rec["energy_last"] < rec["energy_first"], rec
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"blocks.0.attn.omega", "blocks.1.attn.omega"}
    # the record's fit cosine is the model's own embeddings on the same (fit) sentences
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    fit = perm[:9]
    with torch.no_grad():
        cos = (model.sentence_embedding(ids[fit], mask[fit])
               * teacher.sentence_embedding(ids[fit], mask[fit])).sum(1).mean()
    assert float(cos) == pytest.approx(rec["cos_after"], abs=1e-4)


def test_refinement_of_the_hedgehog_baseline_keeps_its_map_tied(tiny_dir, batch):
    ids, mask = batch
    model = load_pretrained_encoder(tiny_dir, "favor", 8, share_features=False, generator=0)
    teacher = load_pretrained_encoder(tiny_dir, "softmax")
    cfg = _cfg(method="hedgehog", lr=0.05, refine_lr=0.02)
    distill_attention(model, ids, mask, cfg, generator=torch.Generator().manual_seed(0))
    rec = refine_encoder(model, teacher, ids, mask, cfg,
                         generator=torch.Generator().manual_seed(0))
    assert rec["method"] == "hedgehog" and rec["cos_after"] > rec["cos_before"], rec
    om = model.attention_layers[1].omega
    assert torch.equal(om[:, :4], -om[:, 4:])


def test_refinement_needs_steps_and_particles(tiny_dir, batch):
    ids, mask = batch
    teacher = load_pretrained_encoder(tiny_dir, "softmax")
    model = load_pretrained_encoder(tiny_dir, "favor", 8, share_features=False, generator=0)
    with pytest.raises(ValueError, match="refine_steps"):
        refine_encoder(model, teacher, ids, mask, _cfg(refine_steps=0),
                       generator=torch.Generator())
    with pytest.raises(ValueError, match="no attention layer with particles"):
        refine_encoder(teacher, teacher, ids, mask, _cfg(), generator=torch.Generator())
    with pytest.raises(ValueError, match="refine_max_drift"):
        DistillConfig(refine_max_drift=-1.0)


def test_adam_projects_after_every_step_and_ties_as_hedgehog():
    from coulomb_attention.dynamics import LangevinSchedule, adam_fit, learn_particles
    from coulomb_attention.dynamics.projections import make_projection

    class Pull:  # D(w) = |w - target|^2 / 2 pulls every particle far outside the ball
        def value_and_grad(self, w, batches, comm=None):
            g = w - 10.0
            return 0.5 * (g * g).sum(), g, {"kl": None}

    stream = iter(lambda: None, 1)
    w0 = torch.zeros(4, 3, dtype=torch.float64)
    ball = make_projection("ball", 1.0)
    free, _ = adam_fit(Pull(), w0, stream, 50, 0.5)
    held, trace = adam_fit(Pull(), w0, stream, 50, 0.5, projection=ball)
    assert free.norm(dim=1).max() > 5 and len(trace) == 50
    assert held.norm(dim=1).max() <= 1.0 + 1e-9  # on the ball, not past it
    one = torch.ones(2, 3, dtype=torch.float64)
    tied0 = torch.cat([one, -one])
    tied = learn_particles(Pull(), tied0, LangevinSchedule(steps=5), stream, projection=None,
                           generator=torch.Generator(), method="hedgehog", lr=0.5).omega
    assert torch.equal(tied[2:], -tied[:2]) and not torch.equal(tied, tied0)  # [W; -W]
    with pytest.raises(ValueError, match="untied"):
        learn_particles(Pull(), w0, LangevinSchedule(steps=5), stream, projection=ball,
                        generator=torch.Generator(), method="hedgehog", lr=0.5)
