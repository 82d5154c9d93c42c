"""llm_corpus: a generated text corpus, its BPE tokenizer and pre-tokenized shards.

Layout::

    llm_corpus/tokenizer.json            byte-level BPE (``tokenizers``), trained here
    llm_corpus/meta.json                 dtype, vocabulary, shard list and token counts
    llm_corpus/train/shard-00000.bin     token ids, flat, uint16 (vocab ≤ 65,536) or uint32
    llm_corpus/train/shard-00000.idx.npy document start offsets (int64, documents + 1)
    llm_corpus/prompts/prompts.bin       serving prompts: [prompts, max_prompt_tokens] ids
    llm_corpus/prompts/lengths.npy       a mixed prompt-length distribution (int64, tokens)

This is the layout large-scale trainers read (Megatron-LM's and GPT-NeoX's
"indexed datasets", nanoGPT's ``train.bin``): documents tokenized once,
offline, each followed by the end-of-text token, concatenated into flat binary
files that the data loader maps with ``numpy.memmap`` and cuts into
fixed-length sequences (packing across document boundaries). The index is a
numpy array, not Megatron's binary header: the same information (document
offsets), read by a library instead of our own parser.

The text is the ``wikitext2`` generator's: words drawn from a Zipf
distribution over a generated vocabulary, here in documents of 60-1,200 words
(paragraphs, sentences ending in ``.``). A random-initialised language model
learns its unigram and bigram statistics within a few hundred steps, so the
training loss falls for real (the ``loss-not-decreasing`` check relies on it).

Sizes (tokens measured with the default vocabulary):

* ``tiny``: 70k tokens in 2 shards, vocabulary 1,024: under a second to
  build, for CPU tests.
* ``standard``: 6.8M training tokens in 4 shards of ~1.7M (13.6 MB),
  vocabulary 32,768; 43 s to build on the 2-core development VM. A 1B model
  on one H100 trains at roughly 30-60k tokens/s (6N FLOPs per token, ~40 %
  of 989 TFLOP/s): 30 s of steady state plus warm-up reads at most ~2.5M
  tokens, less than one pass, so no shard is read twice.

Serving prompts are tokenized documents of the same text: ``prompts.bin``
holds ``prompts`` rows of ``max_prompt_tokens`` ids (a fixed prompt length
``L`` takes each row's first ``L``), and ``lengths.npy`` a realistic mixed
length per prompt: log-normal, median ``max_prompt_tokens / 4``, clipped to
``[8, max_prompt_tokens]`` (chat and RAG prompts are heavy-tailed; MLPerf
Inference's Llama 2 70B set has a median input of ~1k tokens of up to 3k).

The reader (:class:`TokenShards`) checks every file against ``meta.json``
and raises :class:`~milarun.datasets.DatasetError` (a ``ValueError``) naming the
file that does not match; a ``.npy`` header is checked against the file's size
before anything is allocated. Nothing here
imports torch.
"""

import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MilarunError
from ..formats.jsonfile import read_json
from . import DatasetError
from .wikitext2 import vocabulary

VERSION = 1

SIZES = {
    "tiny": {
        "train_words": 60_000,
        "words": 800,
        "vocab_size": 1024,
        "shards": 2,
        "prompts": 32,
        "max_prompt_tokens": 64,
    },
    "standard": {
        "train_words": 6_000_000,
        "words": 33_277,
        "vocab_size": 32_768,
        "shards": 4,
        "prompts": 512,
        "max_prompt_tokens": 2048,
    },
}

#: The end-of-text token appended to every document (GPT-2's name for it).
EOS = "<|endoftext|>"
#: Largest ``meta.json`` read (bytes).
MAX_META_BYTES = 2**20
_FORMAT = "milarun-llm-shards"


def _documents(n_words, words, rng, min_words=60, max_words=1200):
    """Yield documents (str) of Zipf-drawn words until ``n_words`` words in all."""
    ranks = np.arange(1, len(words) + 1, dtype=np.float64)
    probs = ranks**-1.05
    probs /= probs.sum()
    vocab = np.array(words, dtype=object)
    done = 0
    while done < n_words:
        n = min(int(rng.integers(min_words, max_words + 1)), n_words - done)
        ids = rng.choice(len(words), size=n, p=probs)
        toks = vocab[ids].tolist()
        # Sentences of 8-24 words, paragraphs of 3-6 sentences.
        out, pos, sentences = [], 0, 0
        while pos < n:
            k = int(rng.integers(8, 25))
            sent = toks[pos : pos + k]
            sent[0] = sent[0].capitalize()
            out.append(" ".join(sent) + ".")
            pos += k
            sentences += 1
            out.append("\n\n" if sentences % int(rng.integers(3, 7)) == 0 else " ")
        done += n
        yield "".join(out).strip()


def train_tokenizer(texts, vocab_size):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` (iterable of str).

    GPT-2's scheme: bytes mapped to printable characters, merges learned up to
    ``vocab_size`` entries (the 256 byte symbols and :data:`EOS` included).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def token_dtype(vocab_size):
    """``"uint16"`` when every id fits 16 bits, else ``"uint32"``."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def build(root, params, seed):
    """Write the tokenizer, the training shards, the prompts and ``meta.json`` into ``root``."""
    rng = np.random.default_rng(seed)
    words = vocabulary(params["words"])
    docs = list(_documents(params["train_words"], words, rng))
    tok = train_tokenizer(docs, params["vocab_size"])
    tok.save(str(root / "tokenizer.json"))
    vocab_size = tok.get_vocab_size()
    dtype = token_dtype(vocab_size)
    eos = tok.token_to_id(EOS)

    (root / "train").mkdir()
    shards: list[dict[str, Any]] = []
    per_shard = -(-len(docs) // params["shards"])
    for s in range(params["shards"]):
        chunk = docs[s * per_shard : (s + 1) * per_shard]
        ids = [np.asarray(e.ids + [eos], dtype=dtype) for e in tok.encode_batch(chunk)]
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in ids], out=offsets[1:])
        name = f"shard-{s:05d}"
        np.concatenate(ids).tofile(root / "train" / f"{name}.bin")
        np.save(root / "train" / f"{name}.idx.npy", offsets)
        shards.append(
            {
                "bin": f"train/{name}.bin",
                "idx": f"train/{name}.idx.npy",
                "tokens": int(offsets[-1]),
                "documents": len(ids),
            }
        )

    # Prompts: fresh documents, each cut to max_prompt_tokens ids.
    (root / "prompts").mkdir()
    width = params["max_prompt_tokens"]
    rows = []
    for doc in _documents(
        params["prompts"] * width, words, rng, min_words=width, max_words=2 * width
    ):
        ids = tok.encode(doc).ids
        if len(ids) >= width:
            rows.append(ids[:width])
        if len(rows) == params["prompts"]:
            break
    while len(rows) < params["prompts"]:  # the word budget ran out: reuse rows, shifted
        rows.append(rows[len(rows) % max(1, len(rows))][1:] + [eos])
    np.asarray(rows, dtype=dtype).tofile(root / "prompts" / "prompts.bin")
    lengths = np.clip(
        np.round(rng.lognormal(np.log(width / 4), 0.8, size=params["prompts"])),
        min(8, width),
        width,
    ).astype(np.int64)
    np.save(root / "prompts" / "lengths.npy", lengths)

    meta = {
        "format": _FORMAT,
        "version": VERSION,
        "dtype": dtype,
        "vocab_size": vocab_size,
        "eos_id": eos,
        "tokenizer": "tokenizer.json",
        "shards": shards,
        "tokens": sum(s["tokens"] for s in shards),
        "prompts": {
            "bin": "prompts/prompts.bin",
            "lengths": "prompts/lengths.npy",
            "count": params["prompts"],
            "max_tokens": width,
        },
    }
    (root / "meta.json").write_text(json.dumps(meta, indent=1))


def _need(cond, path, why):
    if not cond:
        raise DatasetError(f"{path}: {why}")


def _member(folder, name, where, missing="missing; rebuild: milarun dataset llm_corpus"):
    """The file ``folder / name`` that ``meta.json`` names at ``where``: a regular file
    inside ``folder``.

    Raises:
        DatasetError: ``name`` is not a usable relative path (not a string, a NUL,
            too long), the file is outside ``folder``, missing or not a regular file.
    """
    meta = folder / "meta.json"
    _need(
        isinstance(name, str) and name and "\0" not in name,
        meta,
        f"{where} must be a file name inside the dataset folder",
    )
    path = folder / name
    try:
        inside = path.resolve().is_relative_to(folder.resolve())
        regular = inside and path.is_file()
    except (OSError, RuntimeError) as exc:  # too long a name, a symlink loop
        why = getattr(exc, "strerror", None) or _first_line(exc)
        raise DatasetError(f"{path}: {why}") from None
    _need(inside, path, "outside the dataset folder")
    _need(regular, path, missing)
    return path


def _first_line(exc):
    """The first line of ``exc``'s message (numpy's may run over several)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else exc.__class__.__name__


def _load_vector(path, what):
    """The 1-D integer array in ``.npy`` file ``path``, its header checked against the
    file's size before anything is allocated (a hostile header declaring 10**12
    items is refused, not allocated).

    Raises:
        DatasetError: not a ``.npy`` file, a header too large, not a 1-D integer
            array, or a size that does not match the header (truncated).
    """
    fmt = np.lib.format
    try:
        # non-blocking: a FIFO swapped in after the check cannot hang the open
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            _need(stat.S_ISREG(os.fstat(f.fileno()).st_mode), path, "not a regular file")
            version = fmt.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = fmt.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, _, dtype = fmt.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            _need(
                len(shape) == 1 and dtype.kind in "iu" and not dtype.hasobject,
                path,
                f"{what} must be a 1-D integer array, not {dtype} of shape {shape}",
            )
            left = os.fstat(f.fileno()).st_size - f.tell()
            _need(
                shape[0] * dtype.itemsize == left,
                path,
                f"{left} bytes of data, but its header says {shape[0]} {dtype} items "
                "(truncated or padded)",
            )
            return np.fromfile(f, dtype=dtype, count=shape[0])
    except DatasetError:
        raise
    except (OSError, ValueError, EOFError, SyntaxError) as exc:
        # numpy's header parser raises all of these for a malformed or oversized header
        raise DatasetError(f"{path}: not a .npy {what} file ({_first_line(exc)})") from None


class TokenShards:
    """The pre-tokenized corpus in ``folder``, checked and memory-mapped.

    Attributes:
        vocab_size: ids are in ``[0, vocab_size)``.
        eos_id: the end-of-text id.
        shards: one read-only ``numpy.memmap`` of token ids per shard.
        tokens: training tokens in all shards.

    Raises:
        DatasetError: (a ``ValueError``) a missing or malformed ``meta.json``,
            tokenizer, shard or index, or a shard whose size or index does not
            match ``meta.json``; the message starts with the file's path.
    """

    def __init__(self, folder):
        folder = Path(folder)
        path = folder / "meta.json"
        try:
            meta = read_json(path, max_bytes=MAX_META_BYTES)
        except MilarunError as exc:
            raise DatasetError(str(exc)) from exc
        _need(
            isinstance(meta, dict) and meta.get("format") == _FORMAT,
            path,
            f"not a {_FORMAT} file (key 'format')",
        )
        _need(
            meta.get("dtype") in ("uint16", "uint32"), path, "key 'dtype' must be uint16 or uint32"
        )
        for key in ("vocab_size", "eos_id", "tokens"):
            _need(
                type(meta.get(key)) is int and meta[key] >= 0,
                path,
                f"key {key!r} must be a non-negative integer",
            )
        _need(
            isinstance(meta.get("shards"), list) and meta["shards"],
            path,
            "key 'shards' must be a non-empty list",
        )
        self.folder = folder
        self.meta = meta
        self.vocab_size = meta["vocab_size"]
        self.eos_id = meta["eos_id"]
        self.dtype = np.dtype(meta["dtype"])
        _need(
            self.vocab_size <= np.iinfo(self.dtype).max + 1,
            path,
            f"key 'vocab_size' {self.vocab_size} does not fit {meta['dtype']} ids",
        )
        _need(
            self.eos_id < self.vocab_size,
            path,
            f"key 'eos_id' {self.eos_id} is not below 'vocab_size' {self.vocab_size}",
        )
        _member(
            folder,
            meta.get("tokenizer", "tokenizer.json"),
            "key 'tokenizer'",
            missing="the tokenizer is missing; rebuild: milarun dataset llm_corpus",
        )
        self.shards = []
        for i, s in enumerate(meta["shards"]):
            _need(
                isinstance(s, dict)
                and isinstance(s.get("bin"), str)
                and isinstance(s.get("idx"), str)
                and type(s.get("tokens")) is int
                and s["tokens"] >= 0,
                path,
                f"key 'shards'[{i}] needs 'bin', 'idx' and 'tokens' (>= 0)",
            )
            self.shards.append(self._shard(folder, i, s))
        self.tokens = sum(len(s) for s in self.shards)
        _need(self.tokens == meta["tokens"], path, "key 'tokens' is not the shards' sum")

    def _shard(self, folder, i, s):
        bin_path = _member(folder, s["bin"], f"key 'shards'[{i}].bin")
        idx_path = _member(folder, s["idx"], f"key 'shards'[{i}].idx")
        size = bin_path.stat().st_size
        _need(
            size == s["tokens"] * self.dtype.itemsize,
            bin_path,
            f"{size} bytes, but meta.json says {s['tokens']} {self.dtype} tokens",
        )
        offsets = _load_vector(idx_path, "index")
        _need(
            len(offsets) >= 2
            and offsets[0] == 0
            and offsets[-1] == s["tokens"]
            and bool(np.all(np.diff(offsets) > 0)),
            idx_path,
            f"the document offsets do not match the shard's {s['tokens']} tokens",
        )
        if s["tokens"] == 0:
            return np.zeros(0, dtype=self.dtype)
        try:
            data = np.memmap(bin_path, dtype=self.dtype, mode="r")
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{bin_path}: cannot be read ({_first_line(exc)})") from None
        # an id past the vocabulary would index outside the embedding on the device
        _need(
            int(data.max()) < self.vocab_size,
            bin_path,
            f"holds token ids >= the vocabulary size {self.vocab_size}",
        )
        return data

    def sequences(self, seq_len):
        """Fixed-length training windows: ``(shard, start)`` pairs, each covering
        ``seq_len + 1`` ids (inputs and the targets shifted by one), packed
        across documents, never across shards.

        Raises:
            DatasetError: no shard holds one window.
        """
        out = [
            (i, start)
            for i, s in enumerate(self.shards)
            for start in range(0, len(s) - seq_len, seq_len)
        ]
        if not out:
            raise DatasetError(
                f"{self.folder}: no shard holds one sequence of {seq_len + 1} "
                f"tokens; lower --seq-len or build a larger llm_corpus"
            )
        return out

    def window(self, shard, start, seq_len):
        """``seq_len + 1`` ids (int64 numpy array) from ``shard`` at ``start``."""
        return np.asarray(self.shards[shard][start : start + seq_len + 1], dtype=np.int64)

    def prompts(self):
        """``(rows, lengths)``: prompt ids ``[prompts, max_prompt_tokens]`` (int64) and the
        mixed prompt length of each (int64, tokens).

        Raises:
            DatasetError: a prompts file missing, malformed or not of the size
                ``meta.json`` gives.
        """
        p = self.meta.get("prompts")
        path = self.folder / "meta.json"
        _need(
            isinstance(p, dict)
            and type(p.get("count")) is int
            and type(p.get("max_tokens")) is int
            and p["count"] >= 1
            and p["max_tokens"] >= 1,
            path,
            "key 'prompts' is malformed",
        )
        bin_path = _member(self.folder, p.get("bin"), "key 'prompts'.bin")
        len_path = _member(self.folder, p.get("lengths"), "key 'prompts'.lengths")
        want = p["count"] * p["max_tokens"] * self.dtype.itemsize
        _need(
            bin_path.stat().st_size == want,
            bin_path,
            f"expected {want} bytes for {p['count']} prompts of {p['max_tokens']} tokens",
        )
        try:
            rows = np.fromfile(bin_path, dtype=self.dtype).astype(np.int64)
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{bin_path}: cannot be read ({_first_line(exc)})") from None
        lengths = _load_vector(len_path, "prompt lengths")
        _need(lengths.shape == (p["count"],), len_path, f"expected {p['count']} integer lengths")
        _need(
            bool(np.all((lengths >= 1) & (lengths <= p["max_tokens"]))),
            len_path,
            f"prompt lengths must be from 1 to {p['max_tokens']}",
        )
        _need(
            int(rows.max(initial=0)) < self.vocab_size,
            bin_path,
            f"holds token ids >= the vocabulary size {self.vocab_size}",
        )
        return rows.reshape(p["count"], p["max_tokens"]), lengths.astype(np.int64)
