"""Check a Hugging Face export against the project's own encoder, across two environments.

Step 1, with coulomb-attention installed: embed held-out sentences with the converted
checkpoint (``convert.embed``: masked mean, L2-normalised) and save them::

    python experiments/hf_export_check.py save CHECKPOINT_DIR WORK_DIR --data-dir ../shared/data

Step 2, in a fresh venv holding only torch, transformers and sentence-transformers (this
script imports nothing of coulomb-attention in this mode; with ``--strict`` it refuses to run
where coulomb_attention is importable)::

    python experiments/hf_export_check.py compare HF_DIR WORK_DIR --strict

prints the max abs difference of ``SentenceTransformer(HF_DIR, trust_remote_code=True)`` and of
``AutoModel`` (mean pooling, normalisation by hand) to the saved embeddings.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np


def save(checkpoint: str, work: Path, data_dir: str | None, n: int) -> None:
    from coulomb_attention.convert import embed, load_sentences
    from coulomb_attention.nn.families.bert import (
        load_pretrained_encoder,
        load_pretrained_tokenizer,
    )

    texts = load_sentences(("sst2", "rotten_tomatoes", "qqp"), "eval", data_dir, n, 7)
    texts += ["Short.", "A much longer sentence, with punctuation; numbers 12345 and UPPER case "
              "words, to make the padding matter in a batch of mixed lengths."]
    emb = embed(load_pretrained_encoder(checkpoint), load_pretrained_tokenizer(checkpoint), texts,
                max_length=256, batch_size=32)
    work.mkdir(parents=True, exist_ok=True)
    np.save(work / "project_emb.npy", emb.numpy())
    (work / "texts.json").write_text(json.dumps(texts))
    print(f"saved {tuple(emb.shape)} embeddings to {work}")


def compare(hf_dir: str, work: Path, strict: bool) -> None:
    if strict and importlib.util.find_spec("coulomb_attention") is not None:
        raise SystemExit("coulomb_attention is importable here; run in a fresh venv")
    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"sentence-transformers {sentence_transformers.__version__}")
    texts = json.loads((work / "texts.json").read_text())
    ref = np.load(work / "project_emb.npy")
    st = SentenceTransformer(hf_dir, trust_remote_code=True, device="cpu")
    diff = np.abs(st.encode(texts, batch_size=32) - ref).max()
    print(f"SentenceTransformer: max abs difference {diff:.3g} over {len(texts)} sentences")
    tok = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    model = AutoModel.from_pretrained(hf_dir, trust_remote_code=True).eval()
    out = []
    for i in range(0, len(texts), 32):
        b = tok(texts[i:i + 32], padding=True, truncation=True, max_length=256,
                return_tensors="pt")
        with torch.no_grad():
            h = model(**b).last_hidden_state
        m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
        out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1))
    diff = np.abs(torch.cat(out).numpy() - ref).max()
    print(f"AutoModel: max abs difference {diff:.3g}")
    loaded = sorted(k for k in sys.modules if k.split(".")[0] == "coulomb_attention")
    print(f"coulomb_attention modules loaded: {loaded or 'none'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("save", "compare"))
    p.add_argument("source", help="save: converted checkpoint; compare: the HF directory")
    p.add_argument("work", type=Path, help="folder of the saved embeddings and sentences")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--n", type=int, default=128, help="held-out sentences (save)")
    p.add_argument("--strict", action="store_true", help="refuse if coulomb_attention imports")
    a = p.parse_args()
    if a.mode == "save":
        save(a.source, a.work, a.data_dir, a.n)
    else:
        compare(a.source, a.work, a.strict)


if __name__ == "__main__":
    main()
