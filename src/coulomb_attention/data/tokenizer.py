"""WordPiece tokenizer (HF ``tokenizers``): trained on a training split or wrapped around a
pretrained ``vocab.txt``, cached on disk as JSON, encoding batches to padded tensors.

Special tokens of a trained vocabulary: ``[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4``.
Single texts are encoded ``[CLS] a [SEP]``, pairs ``[CLS] a [SEP] b [SEP]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from .._validation import check_positive
from ..results import atomic_write_text
from .wordpiece import train_wordpiece

__all__ = ["HF_TRAINER", "SPECIAL_TOKENS", "TRAINER", "Tokenizer", "build_tokenizer",
           "texts_fingerprint", "trainer_of"]

#: Special tokens of a trained vocabulary, in id order ([PAD] = 0).
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_FORMAT = "coulomb-attention/wordpiece"
_VERSION = 1
#: Recorded in a trained tokenizer's metadata. Cached files are reused whatever trained them
#: (a run keeps the vocabulary it started with); files without this key came from HF's
#: non-deterministic ``WordPieceTrainer`` (earlier versions of this library).
TRAINER = "coulomb-attention/wordpiece-v1"
#: What :attr:`Tokenizer.trainer` says for a trained file without the ``trainer`` key.
HF_TRAINER = "hf-tokenizers/WordPieceTrainer"


def texts_fingerprint(texts: Sequence[tuple[str, ...] | str], **settings) -> str:
    """sha256 hex digest of the texts (order matters) and the training settings."""
    h = hashlib.sha256()
    h.update(json.dumps(settings, sort_keys=True).encode())
    for item in texts:
        parts = (item,) if isinstance(item, str) else item
        for s in parts:
            h.update(s.encode("utf-8", "surrogatepass"))
            h.update(b"\x1f")
        h.update(b"\x1e")
    return h.hexdigest()


def _as_tuples(texts, name: str = "texts") -> list[tuple[str, ...]]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{name} must be a list of tuples of 1 or 2 strings (or of strings)")
    out = []
    for i, item in enumerate(texts):
        t = (item,) if isinstance(item, str) else item
        if not isinstance(t, (tuple, list)) or len(t) not in (1, 2):
            raise ValueError(
                f"{name}[{i}] must be a string or a tuple of 1 or 2 strings, got {item!r}"
            )
        if not all(isinstance(s, str) for s in t):
            raise TypeError(f"{name}[{i}] must hold strings, got {item!r}")
        out.append(tuple(t))
    return out


def _bert_pipeline(tok: _HFTokenizer, lowercase: bool, cls_id: int, sep_id: int) -> None:
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece(prefix="##")


class Tokenizer:
    """A WordPiece tokenizer with BERT normalisation and ``[CLS] a [SEP] b [SEP]`` pairs.

    Build one with :func:`build_tokenizer` (train), :meth:`from_vocab` (wrap a ``vocab.txt``)
    or :meth:`load` (a file written by :meth:`save`, or a HF ``tokenizer.json``).

    Attributes
    ----------
    vocab_size, pad_id, unk_id, cls_id, sep_id, mask_id : int
        ``mask_id`` is -1 if the vocabulary has no ``[MASK]``.
    special_ids : frozenset of int
        Ids of ``[PAD] [UNK] [CLS] [SEP] [MASK]`` present in the vocabulary.
    meta : dict
        Training settings and fingerprint (saved with the tokenizer).
    """

    def __init__(self, hf_tokenizer: _HFTokenizer, meta: dict | None = None):
        if not isinstance(hf_tokenizer, _HFTokenizer):
            raise TypeError(f"expected a tokenizers.Tokenizer, got {type(hf_tokenizer).__name__}")
        self._tok = hf_tokenizer
        self.meta = dict(meta or {})
        ids = {t: hf_tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
        missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]") if ids[t] is None]
        if missing:
            raise ValueError(f"vocabulary lacks the special token(s) {', '.join(missing)}")
        self.pad_id = int(ids["[PAD]"])
        self.unk_id = int(ids["[UNK]"])
        self.cls_id = int(ids["[CLS]"])
        self.sep_id = int(ids["[SEP]"])
        self.mask_id = int(ids["[MASK]"]) if ids["[MASK]"] is not None else -1
        self.special_ids = frozenset(int(v) for v in ids.values() if v is not None)
        self.vocab_size = int(hf_tokenizer.get_vocab_size(with_added_tokens=True))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_vocab(cls, vocab_txt_path: str | os.PathLike, lowercase: bool = True) -> Tokenizer:
        """Wrap a BERT-style ``vocab.txt`` (one token per line, id = line number).

        The vocabulary must contain ``[PAD] [UNK] [CLS] [SEP]``; the BERT normaliser
        (``lowercase``), pre-tokenizer and ``[CLS] a [SEP] b [SEP]`` template are attached.
        """
        path = pathlib.Path(vocab_txt_path)
        if not path.is_file():
            raise FileNotFoundError(f"vocabulary file {str(path)!r} does not exist")
        try:
            model = WordPiece.from_file(str(path), unk_token="[UNK]")
        except Exception as exc:
            raise ValueError(f"{path}: could not read a WordPiece vocabulary ({exc})") from exc
        tok = _HFTokenizer(model)
        cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        if cls_id is None or sep_id is None or tok.token_to_id("[UNK]") is None:
            raise ValueError(f"{path}: vocabulary must contain [UNK], [CLS] and [SEP]")
        tok.add_special_tokens([t for t in SPECIAL_TOKENS if tok.token_to_id(t) is not None])
        _bert_pipeline(tok, lowercase, cls_id, sep_id)
        return cls(tok, {"vocab_file": str(path), "lowercase": bool(lowercase)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """Load a tokenizer saved by :meth:`save` (or a plain HF ``tokenizer.json``)."""
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {str(path)!r} does not exist")
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not a JSON tokenizer file ({exc})") from exc
        meta = {}
        if isinstance(obj, dict) and obj.get("format") == _FORMAT:
            meta = obj.get("meta", {})
            obj = obj["tokenizer"]
        try:
            hf = _HFTokenizer.from_str(json.dumps(obj))
        except Exception as exc:
            raise ValueError(f"{path}: not a valid tokenizer ({exc})") from exc
        return cls(hf, meta)

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Write the tokenizer as JSON (atomically, replacing ``path``) and return the path."""
        path = pathlib.Path(path)
        atomic_write_text(path, self._to_json())
        return path

    def _to_json(self) -> str:
        payload = {
            "format": _FORMAT,
            "version": _VERSION,
            "meta": self.meta,
            "tokenizer": json.loads(self._tok.to_str()),
        }
        return json.dumps(payload, ensure_ascii=False)

    # ------------------------------------------------------------------ encoding
    def encode_batch(
        self,
        texts: Sequence[tuple[str, ...] | str],
        max_length: int = 128,
        return_token_type_ids: bool = False,
    ) -> tuple[torch.Tensor, ...]:
        """Encode texts to padded id tensors.

        Parameters
        ----------
        texts : list of tuple of str (or of str)
            One or two strings per example; pairs become ``[CLS] a [SEP] b [SEP]``.
        max_length : int
            Truncation length including special tokens (longest-first for pairs).
        return_token_type_ids : bool
            Also return the segment ids (0 for ``a``, 1 for ``b``).

        Returns
        -------
        input_ids : torch.LongTensor, shape (n, T)
            ``T`` = longest encoded example in the batch (<= max_length), padded with ``pad_id``.
        attention_mask : torch.BoolTensor, shape (n, T)
            True for real tokens.
        token_type_ids : torch.LongTensor, shape (n, T)
            Only when ``return_token_type_ids``.
        """
        items = _as_tuples(texts)
        if not items:
            raise ValueError("texts is empty")
        max_length = check_positive("max_length", max_length, integer=True)
        need = 3 if any(len(t) == 2 for t in items) else 2
        if max_length < need:
            raise ValueError(
                f"max_length must be >= {need} to hold the special tokens, got {max_length}"
            )
        tok = self._tok
        tok.enable_truncation(max_length=max_length, strategy="longest_first")
        tok.enable_padding(pad_id=self.pad_id, pad_token=self.id_to_token(self.pad_id))
        try:
            inputs = [t[0] if len(t) == 1 else (t[0], t[1]) for t in items]
            encs = tok.encode_batch(inputs)
        finally:
            tok.no_truncation()
            tok.no_padding()
        # via numpy: several times faster than torch.tensor on nested lists
        ids = torch.from_numpy(np.array([e.ids for e in encs], dtype=np.int64))
        mask = torch.from_numpy(np.array([e.attention_mask for e in encs], dtype=np.bool_))
        if return_token_type_ids:
            types = torch.from_numpy(np.array([e.type_ids for e in encs], dtype=np.int64))
            return ids, mask, types
        return ids, mask

    def encode(self, text: str, pair: str | None = None) -> list[int]:
        """Ids of one example (with special tokens, no truncation or padding)."""
        return self._tok.encode(text, pair).ids if pair is not None else self._tok.encode(text).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of a list of ids (WordPiece ``##`` pieces joined)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, idx: int) -> str | None:
        return self._tok.id_to_token(int(idx))

    def get_vocab(self) -> dict[str, int]:
        """Token -> id mapping."""
        return self._tok.get_vocab(with_added_tokens=True)

    @property
    def backend(self) -> _HFTokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def trainer(self) -> str:
        """Where the vocabulary came from: see :func:`trainer_of`."""
        return trainer_of(self.meta)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, pad_id={self.pad_id})"


def trainer_of(meta: dict) -> str:
    """The vocabulary source recorded in a tokenizer file's metadata: :data:`TRAINER`
    (deterministic), :data:`HF_TRAINER` (a file trained by an earlier version of this library
    with HF's trainer, which is not deterministic across processes), ``"pretrained"`` (a
    ``vocab.txt``) or ``"unknown"`` (a plain HF ``tokenizer.json``)."""
    if "trainer" in meta:
        return str(meta["trainer"])
    if "fingerprint" in meta:
        return HF_TRAINER
    return "pretrained" if "vocab_file" in meta else "unknown"


def build_tokenizer(
    texts: Sequence[tuple[str, ...] | str],
    vocab_size: int = 8000,
    cache_path: str | os.PathLike | None = None,
    *,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
) -> Tokenizer:
    """Train a WordPiece vocabulary on ``texts`` (or load it from ``cache_path``).

    Parameters
    ----------
    texts : list of tuple of str (or of str)
        Training texts (both sides of pairs are used).
    vocab_size : int
        Target size including the special tokens; a small corpus may give fewer.
    cache_path : path, optional
        JSON file to load from if it exists and was built from the same texts and settings,
        else to write after training. If it is an existing folder, the file
        ``wordpiece-v<vocab_size>-<fingerprint[:16]>.json`` inside it is used.
    lowercase : bool
        BertNormalizer lowercasing (and accent stripping).
    min_frequency : int
        Minimum pair frequency for a merge.
    limit_alphabet : int
        Maximum number of distinct initial characters.

    Raises
    ------
    ValueError
        If ``cache_path`` holds a tokenizer built from different texts or settings.
    """
    items = _as_tuples(texts)
    if not items:
        raise ValueError("texts is empty: cannot train a tokenizer")
    vocab_size = check_positive("vocab_size", vocab_size, integer=True)
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed {len(SPECIAL_TOKENS)}, got {vocab_size}")
    min_frequency = check_positive("min_frequency", min_frequency, integer=True)
    limit_alphabet = check_positive("limit_alphabet", limit_alphabet, integer=True)
    settings = {
        "vocab_size": vocab_size,
        "lowercase": bool(lowercase),
        "min_frequency": min_frequency,
        "limit_alphabet": limit_alphabet,
    }
    fingerprint = texts_fingerprint(items, **settings)
    path = None
    if cache_path is not None:
        path = pathlib.Path(cache_path)
        if path.is_dir():
            path = path / f"wordpiece-v{vocab_size}-{fingerprint[:16]}.json"
        if path.is_file():
            tok = Tokenizer.load(path)
            if tok.meta.get("fingerprint") != fingerprint:
                raise ValueError(
                    f"tokenizer cache {path} was built from different texts or settings "
                    f"(fingerprint {str(tok.meta.get('fingerprint'))[:16]} != {fingerprint[:16]});"
                    " delete it or pass a folder as cache_path to key the file by fingerprint"
                )
            return tok

    # HF's WordPieceTrainer breaks ties in hash-map order (a different vocabulary in every
    # process, huggingface/tokenizers#1794): train with the deterministic trainer instead, on
    # words split by the same normaliser and pre-tokeniser that encoding uses.
    normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    counts: Counter[str] = Counter()
    for t in items:
        for s in t:
            counts.update(w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(s)))
    learned = train_wordpiece(dict(counts), vocab_size, min_frequency=min_frequency,
                              limit_alphabet=limit_alphabet, special_tokens=SPECIAL_TOKENS)
    # canonical ids: special tokens first, the rest sorted
    vocab = {t: i for i, t in enumerate((*SPECIAL_TOKENS, *sorted(learned[len(SPECIAL_TOKENS):])))}
    hf = _HFTokenizer(WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
    hf.add_special_tokens(list(SPECIAL_TOKENS))
    assert [hf.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    _bert_pipeline(hf, lowercase, vocab["[CLS]"], vocab["[SEP]"])
    meta = {**settings, "fingerprint": fingerprint, "n_texts": len(items), "trainer": TRAINER}
    tok = Tokenizer(hf, meta)
    if path is not None and not atomic_write_text(path, tok._to_json(), exclusive=True):
        # another process cached the same texts meanwhile: use its file, so that every user of
        # the cache sees the same vocabulary
        return build_tokenizer(
            items,
            vocab_size,
            path,
            lowercase=lowercase,
            min_frequency=min_frequency,
            limit_alphabet=limit_alphabet,
        )
    return tok
