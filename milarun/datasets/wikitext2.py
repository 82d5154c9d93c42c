"""wikitext2: a synthetic corpus in the WikiText-2 (tokenised) layout.

Layout::

    wikitext2/wiki.train.tokens
    wikitext2/wiki.valid.tokens
    wikitext2/wiki.test.tokens

The files look like the real ones: one paragraph per line, a leading and a
trailing space, tokens separated by single spaces, blank lines between
paragraphs and `` = Heading = `` / `` = = Sub heading = = `` lines. Words
are drawn from a Zipf distribution over a generated vocabulary that holds
``<unk>``, punctuation and number tokens such as ``@-@`` and ``@,@``.

The standard size has about the real token counts (2.09M / 218k / 246k)
and vocabulary (33,278 types with ``<eos>``).

``Corpus`` is the reader the ``wlm`` model uses: it tokenises each line by
whitespace, appends ``<eos>`` and numbers the words in order of first
appearance, like PyTorch's classic ``word_language_model`` example. It does
not import torch: the ids come back as numpy arrays.
"""

import numpy as np

VERSION = 1

SIZES = {
    "tiny": {"train_tokens": 30_000, "valid_tokens": 3_000, "test_tokens": 3_000, "vocab": 800},
    "standard": {
        "train_tokens": 2_088_628,
        "valid_tokens": 217_646,
        "test_tokens": 245_569,
        "vocab": 33_277,
    },
}

SPLITS = ("train", "valid", "test")

# Frequent tokens of the real corpus, placed at the head of the Zipf ranking.
_HEAD = [
    "the",
    ",",
    ".",
    "of",
    "and",
    "in",
    "to",
    "a",
    "<unk>",
    "was",
    '"',
    "The",
    "@-@",
    "'s",
    "that",
    "as",
    "for",
    "with",
    "by",
    "on",
    "is",
    "(",
    ")",
    "his",
    "at",
    "from",
    "it",
    "he",
    "an",
    "were",
    "had",
    "which",
    "@,@",
    "@.@",
    ";",
    "be",
    "are",
    "this",
    "but",
    "their",
    "not",
    "also",
    "first",
    "its",
    "or",
]

_ONSETS = [
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "z",
    "br",
    "ch",
    "cr",
    "dr",
    "fl",
    "gr",
    "pl",
    "pr",
    "sh",
    "st",
    "th",
    "tr",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ie", "ou", "y"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "rk"]


def _word(i):
    """A deterministic pronounceable word for integer ``i`` (distinct per i)."""
    parts = []
    n = i
    while True:
        n, a = divmod(n, len(_ONSETS))
        n, b = divmod(n, len(_VOWELS))
        n, c = divmod(n, len(_CODAS))
        parts.append(_ONSETS[a] + _VOWELS[b] + _CODAS[c])
        if n == 0:
            break
        n -= 1
    word = "".join(parts)
    return word.capitalize() if i % 7 == 3 else word


def vocabulary(size):
    """The ``size`` word types in Zipf rank order (``<eos>`` not included)."""
    words = list(_HEAD[:size])
    seen = set(words)
    i = 0
    while len(words) < size:
        w = _word(i)
        i += 1
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def _write_split(path, n_tokens, words, probs, rng):
    """Write about ``n_tokens`` tokens (with one ``<eos>`` per line) to ``path``."""
    ids = rng.choice(len(words), size=n_tokens, p=probs)
    vocab = np.array(words, dtype=object)
    lines = []
    pos = 0
    heading_every = 6
    k = 0
    while pos < n_tokens:
        if k % heading_every == 0:
            # heading: 1-4 words between "=" marks (one or two levels), then a blank line
            depth = 1 if k % (heading_every * 3) == 0 else 2
            n = min(int(rng.integers(1, 5)), n_tokens - pos)
            marks = " ".join(["="] * depth)
            lines.append(f" {marks} {' '.join(vocab[ids[pos : pos + n]])} {marks} ")
            lines.append(" ")
            pos += n
        else:
            n = min(int(rng.integers(20, 160)), n_tokens - pos)
            lines.append(" " + " ".join(vocab[ids[pos : pos + n]]) + " ")
            lines.append(" ")
            pos += n
        k += 1
    with open(path, "w", encoding="utf-8") as f:
        f.write(" \n")
        for line in lines:
            f.write(line + "\n")


def build(root, params, seed):
    """Write ``wiki.{train,valid,test}.tokens`` into ``root``."""
    rng = np.random.default_rng(seed)
    words = vocabulary(params["vocab"])
    ranks = np.arange(1, len(words) + 1, dtype=np.float64)
    probs = ranks**-1.05
    probs /= probs.sum()
    for split in SPLITS:
        _write_split(root / f"wiki.{split}.tokens", params[f"{split}_tokens"], words, probs, rng)


class Dictionary:
    """Word ↔ id mapping, ids in order of first appearance."""

    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        idx = self.word2idx.get(word)
        if idx is None:
            idx = len(self.idx2word)
            self.word2idx[word] = idx
            self.idx2word.append(word)
        return idx

    def __len__(self):
        return len(self.idx2word)


class Corpus:
    """Reads ``wiki.{train,valid,test}.tokens`` from ``folder``.

    Attributes:
        dictionary: the shared ``Dictionary`` (train words first).
        train, valid, test: int64 numpy arrays of word ids; each line of a
            file becomes its whitespace-separated words followed by ``<eos>``.
    """

    def __init__(self, folder, splits=SPLITS):
        from pathlib import Path

        self.dictionary = Dictionary()
        for split in splits:
            setattr(self, split, self.tokenize(Path(folder) / f"wiki.{split}.tokens"))

    def tokenize(self, path):
        """Word ids of the file at ``path`` (numpy int64)."""
        add = self.dictionary.add_word
        ids = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                for word in line.split():
                    ids.append(add(word))
                ids.append(add("<eos>"))
        return np.array(ids, dtype=np.int64)
