"""wmt16: synthetic English→German parallel text in the WMT16 (GNMT) layout.

Layout (the names of the MLPerf GNMT reference's pre-processed WMT16 files)::

    wmt16/vocab.bpe.32000                    shared subword vocabulary, one token a line
    wmt16/train.tok.clean.bpe.32000.en       one tokenised, BPE-split sentence a line
    wmt16/train.tok.clean.bpe.32000.de       (same line count as .en)
    wmt16/newstest2014.tok.bpe.32000.en      test split
    wmt16/newstest2014.tok.bpe.32000.de

Subwords that continue a word end in ``@@`` (``Kin@@ der@@ garten``), as
subword-nmt writes them. The German side is a deterministic "translation" of
the English side (a token mapping plus local reordering and length noise),
so a model can learn something. Sentence lengths follow a log-normal shape
with a long tail, like the real corpus.

The standard size has 300,000 training pairs (the real corpus has 4.5M;
more would make the build slow and the reader's start-up long) and 3,003
test pairs like newstest2014.

``Vocab`` and ``ParallelCorpus`` are the readers the ``translator`` model
uses. They do not import torch.
"""

import numpy as np

VERSION = 1

SIZES = {
    "tiny": {"train_pairs": 2_000, "test_pairs": 200, "vocab": 1_000},
    "standard": {"train_pairs": 300_000, "test_pairs": 3_003, "vocab": 32_000},
}

VOCAB_FILE = "vocab.bpe.32000"
SPLIT_FILES = {"train": "train.tok.clean.bpe.32000", "test": "newstest2014.tok.bpe.32000"}

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
SPECIALS = (PAD, UNK, BOS, EOS)

_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
_PUNCT = [",", ".", "&quot;", "-", "&apos;s", ":", "(", ")", "?", "!"]


def _pieces(n):
    """``n`` distinct subword strings (letters only), short ones first."""
    out: list[str] = []
    length = 1
    rng = np.random.default_rng(12345)
    seen = set()
    while len(out) < n:
        want = min(n - len(out), 26**length)
        tries = 0
        while want > 0 and tries < 40 * (want + 10):
            tries += 1
            s = "".join(_LETTERS[int(i)] for i in rng.integers(0, 26, size=length))
            if s not in seen:
                seen.add(s)
                out.append(s)
                want -= 1
        length += 1
    return out


def vocabulary(size):
    """The subword vocabulary: punctuation, word-final pieces and ``@@`` pieces.

    About two thirds are word-final pieces (``haus``), a third continuation
    pieces (``kin@@``); a capitalised variant is included for some.
    """
    words = list(_PUNCT[:size])
    rest = size - len(words)
    n_cont = rest // 3
    n_final = rest - n_cont
    pieces = _pieces(n_final + n_cont)
    for i, p in enumerate(pieces[:n_final]):
        words.append(p.capitalize() if i % 11 == 5 else p)
    for p in pieces[n_final:]:
        words.append(p + "@@")
    return words


def _sentences(rng, n, vocab_size, n_punct, n_final, zipf):
    """Token-id sentences (lists) over the vocabulary, as whole words.

    A word is 0-2 continuation pieces followed by one final piece; a
    sentence has log-normal many words and ends with punctuation.
    """
    n_words = np.clip(np.round(rng.lognormal(2.6, 0.55, size=n)), 2, 80).astype(np.int64)
    total = int(n_words.sum())
    finals = n_punct + _zipf_ids(rng, total, n_final, zipf)
    n_cont = vocab_size - n_punct - n_final
    ncont_per_word = rng.choice(3, size=total, p=[0.7, 0.22, 0.08])
    conts = n_punct + n_final + _zipf_ids(rng, int(ncont_per_word.sum()), n_cont, zipf)
    sents = []
    w = 0
    c = 0
    ends = rng.integers(0, 2, size=n)  # "." or ","-ended sentences
    for i in range(n):
        toks = []
        for _ in range(int(n_words[i])):
            k = int(ncont_per_word[w])
            toks.extend(conts[c : c + k].tolist())
            c += k
            toks.append(int(finals[w]))
            w += 1
        toks.append(1 if ends[i] else 0)
        sents.append(toks)
    return sents


def _zipf_ids(rng, n, size, a):
    ranks = np.arange(1, size + 1, dtype=np.float64)
    p = ranks**-a
    p /= p.sum()
    return rng.choice(size, size=n, p=p)


def _translate(sent, mapping, rng):
    """German side: mapped tokens, a few adjacent swaps, sometimes a dropped or extra token."""
    out = [int(mapping[t]) for t in sent]
    for _ in range(len(out) // 6):
        j = int(rng.integers(0, max(1, len(out) - 2)))
        out[j], out[j + 1] = out[j + 1], out[j]
    r = rng.random()
    if r < 0.15 and len(out) > 3:
        del out[int(rng.integers(0, len(out) - 1))]
    elif r < 0.35:
        out.insert(int(rng.integers(0, len(out))), int(out[0]))
    return out


def build(root, params, seed):
    """Write the vocabulary and the train/test parallel files into ``root``."""
    rng = np.random.default_rng(seed)
    words = vocabulary(params["vocab"])
    n_punct = len(_PUNCT[: params["vocab"]])
    rest = params["vocab"] - n_punct
    n_cont = rest // 3
    n_final = rest - n_cont
    vocab = np.array(words, dtype=object)
    # token mapping en → de: punctuation kept, final and continuation pieces permuted
    mapping = np.arange(len(words))
    for lo, hi in ((n_punct, n_punct + n_final), (n_punct + n_final, len(words))):
        mapping[lo:hi] = lo + rng.permutation(hi - lo)
    (root / VOCAB_FILE).write_text("\n".join(words) + "\n", encoding="utf-8")
    for split, stem in SPLIT_FILES.items():
        n = params[f"{split}_pairs"]
        sents = _sentences(rng, n, len(words), n_punct, n_final, 1.0)
        with (
            open(root / f"{stem}.en", "w", encoding="utf-8") as fen,
            open(root / f"{stem}.de", "w", encoding="utf-8") as fde,
        ):
            for s in sents:
                fen.write(" ".join(vocab[s]) + "\n")
                fde.write(" ".join(vocab[_translate(s, mapping, rng)]) + "\n")


class Vocab:
    """Shared subword vocabulary: ``<pad> <unk> <s> </s>`` then the file's tokens."""

    def __init__(self, path):
        self.itos = list(SPECIALS)
        with open(path, encoding="utf-8") as f:
            for line in f:
                tok = line.strip()
                if tok:
                    self.itos.append(tok)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self.pad, self.unk, self.bos, self.eos = (self.stoi[t] for t in SPECIALS)

    def __len__(self):
        return len(self.itos)

    def encode(self, line):
        """Token ids of a whitespace-tokenised line (no BOS/EOS)."""
        get = self.stoi.get
        unk = self.unk
        return [get(t, unk) for t in line.split()]

    def decode(self, ids):
        """Text of ``ids`` with ``@@`` continuations joined back into words."""
        toks = [self.itos[i] for i in ids if i not in (self.pad, self.bos, self.eos)]
        return " ".join(toks).replace("@@ ", "")


class ParallelCorpus:
    """Reads the ``.en``/``.de`` files of ``split`` and encodes them.

    Pairs with an empty side, or a side longer than ``max_len`` tokens, are
    dropped (like the reference's length filter).

    Attributes:
        vocab: the ``Vocab``.
        src, tgt: lists of id lists (English, German).
        lines: number of lines read per side.
    """

    def __init__(self, folder, split="train", max_len=80, src_lang="en", tgt_lang="de"):
        from pathlib import Path

        folder = Path(folder)
        self.vocab = Vocab(folder / VOCAB_FILE)
        stem = SPLIT_FILES[split]
        self.src, self.tgt = [], []
        self.lines = 0
        with (
            open(folder / f"{stem}.{src_lang}", encoding="utf-8") as fs,
            open(folder / f"{stem}.{tgt_lang}", encoding="utf-8") as ft,
        ):
            for ls, lt in zip(fs, ft):
                self.lines += 1
                s = self.vocab.encode(ls)
                t = self.vocab.encode(lt)
                if 0 < len(s) <= max_len and 0 < len(t) <= max_len:
                    self.src.append(s)
                    self.tgt.append(t)

    def __len__(self):
        return len(self.src)

    def length_batches(self, batch_size, seed=0, bucket=64):
        """Lists of pair indices of similar lengths, in a shuffled order.

        Pairs are sorted by (source, target) length inside random chunks of
        ``batch_size * bucket`` pairs, cut into batches of ``batch_size``,
        and the batches are shuffled; a short last batch of a chunk is kept.
        """
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(self.src))
        chunk = batch_size * bucket
        batches = []
        for lo in range(0, len(order), chunk):
            part = order[lo : lo + chunk]
            keys = [(len(self.src[i]), len(self.tgt[i])) for i in part]
            part = part[sorted(range(len(part)), key=keys.__getitem__)]
            for b in range(0, len(part), batch_size):
                batches.append(part[b : b + batch_size].tolist())
        rng.shuffle(batches)
        return batches
