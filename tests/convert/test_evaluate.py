"""The teacher's probe beside the converted encoder's (``convert.evaluate.evaluate_encoder``):
the same probe on the same examples, so a model equal to the teacher scores exactly the
teacher's probe, and a converted one its own; not computed when the model is the teacher or
when asked not to."""

from __future__ import annotations

from coulomb_attention.convert import ConvertConfig
from coulomb_attention.convert.evaluate import evaluate_encoder
from coulomb_attention.nn.families.bert import load_pretrained_encoder, load_pretrained_tokenizer
from test_pretrained import write_tiny_bert


def test_the_teacher_is_probed_on_the_same_examples(tmp_path):
    d = write_tiny_bert(tmp_path, qk_scale=4.0)
    teacher = load_pretrained_encoder(d, "softmax")
    twin = load_pretrained_encoder(d, "softmax")  # equal weights, another object
    student = load_pretrained_encoder(d, "favor", 6, share_features=False, generator=0)
    tok = load_pretrained_tokenizer(d)
    cfg = ConvertConfig(encoder=str(d), n_features=6, max_length=16, eval_sentences=8,
                        probe_tasks=("sst2",), probe_train=40, probe_eval=30)
    own = evaluate_encoder(twin, teacher, tok, cfg, documents=False)
    assert own["teacher_probe"] == own["probe"]  # the teacher's probe, recomputed
    conv = evaluate_encoder(student, teacher, tok, cfg, documents=False)
    assert conv["teacher_probe"] == own["probe"]
    assert conv["probe"]["sst2"]["log_loss"] != own["probe"]["sst2"]["log_loss"]
    assert conv["teacher_probe"]["sst2"]["n_eval"] == conv["probe"]["sst2"]["n_eval"] == 30
    assert "teacher_probe" not in evaluate_encoder(teacher, teacher, tok, cfg, documents=False)
    assert "teacher_probe" not in evaluate_encoder(student, teacher, tok, cfg, documents=False,
                                                   teacher_probe=False)
