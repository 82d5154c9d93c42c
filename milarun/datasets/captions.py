"""captions: a caption for every training image of ``fake_imagenet``, and its tokenizer.

The ``diffusion`` workload trains a text-to-image model, so each image needs a
caption. ``fake_imagenet``'s layout (and the digests of its builds) stays as it
is: the captions are a dataset of their own, beside it, keyed by the image's
path inside ``fake_imagenet``.

Layout::

    captions/captions.jsonl   one line per image: {"image": "train/n00000003/0000007.jpg",
                              "label": 3, "text": "a blurry photo of ..."}
    captions/tokenizer.json   a word-level tokenizer (``tokenizers``), trained here
    captions/meta.json        count, classes, vocabulary size, maximum length, BOS/EOS ids

Captions are words, generated deterministically from the image's class and
index (``numpy.random.default_rng([seed, index])``): a class noun and a class
colour (the class's stripes in ``fake_imagenet`` have a fixed colour and
angle), plus a style, adjectives and a scene drawn per image, so that a text
encoder has something to tell apart, 11 to 19 words long.

**Tokenizer: word level**, ``tokenizers``' ``WordLevel`` model with CLIP's
conventions: lower-case, split on white space and punctuation,
``<|startoftext|>`` and ``<|endoftext|>`` around every caption, padded (with
the end-of-text id, as CLIP pads) and truncated to 77 positions, unknown words
to ``<|unk|>``. Why not a BPE like CLIP's: CLIP's 49,408-entry BPE was learnt
on 400M web captions, which cannot be downloaded; a BPE trained on these
generated captions would learn one token per word anyway, since the words come
from a closed list. A word-level vocabulary over that list is exact and small,
and tokenizing a caption costs microseconds either way, next to decoding its
JPEG. The text encoder's embedding table has the tokenizer's size, not CLIP's
(as the LLM tests use their corpus's vocabulary).

Sizes (``count`` and ``classes`` match ``fake_imagenet``'s preset of the same
name: build both with the same ``--size``, or the same ``--count``):

* ``tiny``: 256 captions over 4 classes.
* ``standard``: 16,000 captions over 1,000 classes, about 2 MB, a second or two.

The reader (:func:`read_captions`) checks ``meta.json`` and every line, and
raises ``ValueError`` naming the file. Nothing here imports torch.
"""

import json
from pathlib import Path

import numpy as np

from ..errors import MilarunError
from ..formats.jsonfile import read_json
from .fake_imagenet import class_name
from .wikitext2 import vocabulary

VERSION = 1

SIZES = {
    "tiny": {"count": 256, "classes": 4},
    "standard": {"count": 16000, "classes": 1000},
}

#: CLIP's text context: every caption becomes this many ids.
MAX_LENGTH = 77
BOS, EOS, UNK = "<|startoftext|>", "<|endoftext|>", "<|unk|>"
#: Largest ``meta.json`` read (bytes).
MAX_META_BYTES = 2**20
#: Largest ``captions.jsonl`` read (bytes): 10M captions of ~150 bytes.
MAX_CAPTIONS_BYTES = 2**31
_FORMAT = "milarun-captions"

_STYLES = [
    "photo",
    "picture",
    "painting",
    "drawing",
    "snapshot",
    "render",
    "sketch",
    "close-up",
    "photograph",
    "illustration",
    "print",
    "still",
]
_ADJECTIVES = [
    "small",
    "large",
    "bright",
    "dark",
    "blurry",
    "sharp",
    "old",
    "new",
    "striped",
    "shiny",
    "dusty",
    "wet",
    "tiny",
    "huge",
    "round",
    "tall",
    "soft",
    "rough",
    "faded",
    "vivid",
    "quiet",
    "busy",
    "lonely",
    "strange",
]
_COLOURS = [
    "red",
    "green",
    "blue",
    "yellow",
    "orange",
    "purple",
    "pink",
    "brown",
    "black",
    "white",
    "grey",
    "teal",
    "gold",
    "silver",
    "violet",
    "crimson",
]
_SCENES = [
    "on a table",
    "in a field",
    "near the sea",
    "at night",
    "in the snow",
    "under a tree",
    "on a street",
    "in a room",
    "by a window",
    "in the rain",
    "on the grass",
    "in a forest",
    "at dawn",
    "on a shelf",
    "in the desert",
    "next to a wall",
]
_LIGHT = [
    "in soft light",
    "in harsh light",
    "with a shadow",
    "in the morning",
    "in the evening",
    "with a bokeh background",
    "in high contrast",
    "in black and white",
]


def caption(seed, index, label, nouns):
    """The caption (str) of training image ``index`` of class ``label``."""
    rng = np.random.default_rng([seed, index])
    noun = nouns[label]
    colour = _COLOURS[label % len(_COLOURS)]
    words = ["a", _STYLES[int(rng.integers(len(_STYLES)))], "of", "a"]
    words += [
        _ADJECTIVES[int(i)]
        for i in rng.choice(len(_ADJECTIVES), size=int(rng.integers(1, 4)), replace=False)
    ]
    words += [noun, "with", colour, "stripes"]
    words += _SCENES[int(rng.integers(len(_SCENES)))].split()
    if rng.random() < 0.5:
        words += _LIGHT[int(rng.integers(len(_LIGHT)))].split()
    return " ".join(words)


def train_tokenizer(texts):
    """A word-level ``tokenizers.Tokenizer`` over ``texts``, padded and truncated to
    :data:`MAX_LENGTH` with CLIP's start and end tokens."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    trainer = trainers.WordLevelTrainer(special_tokens=[BOS, EOS, UNK], show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, bos), (EOS, eos)]
    )
    tok.enable_truncation(MAX_LENGTH)
    tok.enable_padding(length=MAX_LENGTH, pad_id=eos, pad_token=EOS)
    return tok


def build(root, params, seed):
    """Write ``captions.jsonl``, ``tokenizer.json`` and ``meta.json`` into ``root``."""
    root = Path(root)
    classes, count = params["classes"], params["count"]
    if classes < 1 or count < classes:
        raise ValueError("captions needs classes >= 1 and count >= classes, as fake_imagenet")
    nouns = vocabulary(classes + 200)[200:]  # past the function words of the Zipf head
    lines, texts = [], []
    for i in range(count):
        label = i % classes
        text = caption(seed, i, label, nouns)
        texts.append(text)
        image = f"train/{class_name(label)}/{i:07d}.jpg"  # fake_imagenet's layout
        lines.append(json.dumps({"image": image, "label": label, "text": text}))
    (root / "captions.jsonl").write_text("\n".join(lines) + "\n")
    tok = train_tokenizer(texts)
    tok.save(str(root / "tokenizer.json"))
    meta = {
        "format": _FORMAT,
        "version": VERSION,
        "count": count,
        "classes": classes,
        "vocab_size": tok.get_vocab_size(),
        "max_length": MAX_LENGTH,
        "bos_id": tok.token_to_id(BOS),
        "eos_id": tok.token_to_id(EOS),
        "tokenizer": "tokenizer.json",
        "captions": "captions.jsonl",
    }
    (root / "meta.json").write_text(json.dumps(meta, indent=1))


def read_captions(folder):
    """``(meta, [(image path relative to fake_imagenet, text), ...])`` of ``folder``.

    Raises:
        ValueError: a missing or malformed ``meta.json``, tokenizer or caption
            file, or a caption count that differs from ``meta.json``'s; the
            message starts with the file's path.
    """
    folder = Path(folder)
    path = folder / "meta.json"
    try:
        meta = read_json(path, max_bytes=MAX_META_BYTES)
    except MilarunError as exc:
        raise ValueError(str(exc)) from exc
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a {_FORMAT} file (key 'format')")
    tok = folder / "tokenizer.json"
    if not tok.is_file():
        raise ValueError(f"{tok}: the tokenizer is missing; rebuild the dataset")
    path = folder / "captions.jsonl"
    if not path.is_file() or path.stat().st_size > MAX_CAPTIONS_BYTES:
        raise ValueError(f"{path}: missing or larger than {MAX_CAPTIONS_BYTES} bytes")
    items = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                items.append((str(row["image"]), str(row["text"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}: line {n} is not a caption record ({exc})") from exc
    if len(items) != meta.get("count"):
        raise ValueError(f"{path}: {len(items)} captions, but meta.json says {meta.get('count')}")
    return meta, items
