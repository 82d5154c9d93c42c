"""wikitext2, wmt16 and movielens builders, read back through the models' readers."""

import hashlib

import numpy as np
import pytest
from conftest import build_tiny

from milarun.datasets import prepare


def _digest(folder):
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def root(tiny_dataroot):
    return build_tiny(tiny_dataroot, "wikitext2", "wmt16", "movielens")


def test_wikitext2_reads_back_with_corpus(root):
    from milarun.datasets.wikitext2 import SIZES, Corpus

    folder = root / "wikitext2"
    corpus = Corpus(folder)
    d = corpus.dictionary
    eos = d.word2idx["<eos>"]
    for split in ("train", "valid", "test"):
        ids = getattr(corpus, split)
        text = (folder / f"wiki.{split}.tokens").read_text(encoding="utf-8")
        lines = text.splitlines()
        assert ids.dtype == np.int64
        # one <eos> per line, plus every whitespace-separated word
        assert (ids == eos).sum() == len(lines)
        assert len(ids) == len(text.split()) + len(lines)
        assert (
            len(ids) - len(lines) - sum(line.count("=") for line in lines)
            == SIZES["tiny"][f"{split}_tokens"]
        )
    assert any(line.startswith(" = ") and line.endswith(" = ") for line in lines)
    assert "<unk>" in d.word2idx
    assert 100 < len(d) <= SIZES["tiny"]["vocab"] + 2  # + <eos> and "="
    assert d.idx2word[corpus.train[1]] == "="  # the file opens with a blank line, then a heading


def test_wmt16_parallel_files_and_vocab(root):
    from milarun.datasets.wmt16 import SIZES, SPLIT_FILES, VOCAB_FILE, ParallelCorpus, Vocab

    folder = root / "wmt16"
    vocab = Vocab(folder / VOCAB_FILE)
    assert len(vocab) == SIZES["tiny"]["vocab"] + 4
    assert vocab.itos[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert any(t.endswith("@@") for t in vocab.itos)
    for split, stem in SPLIT_FILES.items():
        en = (folder / f"{stem}.en").read_text(encoding="utf-8").splitlines()
        de = (folder / f"{stem}.de").read_text(encoding="utf-8").splitlines()
        assert len(en) == len(de) == SIZES["tiny"][f"{split}_pairs"]
        # every token is in the shared vocabulary; a sentence never ends mid-word
        for line in en[:50] + de[:50]:
            assert all(t in vocab.stoi for t in line.split())
            assert not line.split()[-1].endswith("@@")
    corpus = ParallelCorpus(folder, "train", max_len=1000)
    assert corpus.lines == len(corpus) == SIZES["tiny"]["train_pairs"]
    assert vocab.unk not in {i for s in corpus.src for i in s}
    short = ParallelCorpus(folder, "train", max_len=10)
    assert 0 < len(short) < len(corpus)
    assert max(len(s) for s in short.src + short.tgt) <= 10
    batches = corpus.length_batches(32, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(len(corpus)))
    # batches group similar lengths: much tighter than the corpus-wide spread
    spread = np.mean(
        [max(len(corpus.src[i]) for i in b) - min(len(corpus.src[i]) for i in b) for b in batches]
    )
    lengths = [len(s) for s in corpus.src]
    assert spread < (max(lengths) - min(lengths)) / 4


def test_translator_collate_pads_and_adds_bos_eos():
    from milarun.models.translator import Collate

    src, tin, tout, ntok = Collate(pad=0, bos=2, eos=3)([([5, 6], [7]), ([8], [9, 10, 11])])
    assert src.tolist() == [[5, 6, 3], [8, 3, 0]]
    assert tin.tolist() == [[2, 7, 0, 0], [2, 9, 10, 11]]
    assert tout.tolist() == [[7, 3, 0, 0], [9, 10, 11, 3]]
    assert ntok == 6


def test_movielens_csv_reads_with_pandas(root):
    from milarun.datasets.movielens import SIZES, load_ratings
    from milarun.models.recom import leave_one_out

    folder = root / "movielens"
    header = (folder / "ml-20m" / "ratings.csv").read_text().splitlines()[0]
    assert header == "userId,movieId,rating,timestamp"
    df = load_ratings(folder)
    size = SIZES["tiny"]
    assert list(df.columns) == ["userId", "movieId", "rating", "timestamp"]
    assert 0.8 * size["ratings"] <= len(df) <= size["ratings"]
    assert df["userId"].nunique() == size["users"]
    assert df["movieId"].between(1, size["movies"]).all()
    assert set(np.unique(df["rating"] * 2)) <= set(range(1, 11))
    assert not df.duplicated(["userId", "movieId"]).any()
    assert df.groupby("userId").size().min() >= 2
    tr_u, tr_i, te_u, te_i, n_users, n_items = leave_one_out(df)
    assert len(te_u) == n_users == size["users"]
    assert len(tr_u) + len(te_u) == len(df)
    assert tr_i.max() < n_items


@pytest.mark.parametrize("name", ["wikitext2", "wmt16", "movielens"])
def test_same_seed_same_bytes(name, root, tmp_path):
    again = prepare(name, tmp_path, size="tiny", log=lambda *a: None)
    assert _digest(again) == _digest(root / name)
    other = prepare(name, tmp_path / "other", size="tiny", seed=1, log=lambda *a: None)
    assert _digest(other) != _digest(again)
