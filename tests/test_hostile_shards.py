"""Hostile llm_corpus files: a truncated, oversized-header, wrong-dtype or
misnamed token shard or index is a DatasetError naming the file, never an allocation, an
EOFError or a TypeError; under ``milarun run`` it is a FAIL record and one console line,
the traceback only in the record (and on the console with ``--verbose``)."""

import json
import shutil
import struct

import numpy as np
import pytest
from conftest import build_tiny

from milarun.cli import main
from milarun.datasets import DatasetError, DatasetMissing, require
from milarun.datasets.llm_corpus import TokenShards

IDX = "train/shard-00000.idx.npy"
BIN = "train/shard-00000.bin"
LENGTHS = "prompts/lengths.npy"
TRAIN = [
    "--sample-duration",
    "0.001",
    "--warmup",
    "1",
    "--device",
    "cpu",
    "--shape",
    "tiny",
    "--precision",
    "fp32",
    "--seq-len",
    "32",
    "--batch-size",
    "4",
    "--workers",
    "0",
    "--max-count",
    "50",
]


@pytest.fixture(scope="module")
def corpus(tiny_dataroot):
    return build_tiny(tiny_dataroot, "llm_corpus") / "llm_corpus"


def copy(corpus, tmp_path):
    """A copy of the built corpus in ``tmp_path/data/llm_corpus`` (stamp included)."""
    dst = tmp_path / "data" / "llm_corpus"
    shutil.copytree(corpus, dst)
    return dst


def npy(shape, descr="<i8", pad=0, data=b""):
    """A ``.npy`` file's bytes with the header numpy would write, and ``data`` after it."""
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}) + " " * pad
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


def edit_meta(folder, **changes):
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(changes)
    (folder / "meta.json").write_text(json.dumps(meta))


HOSTILE = {
    # what is written → the file the message must start with, and a part of the message
    "index empty": (lambda f: (f / IDX).write_bytes(b""), IDX, "not a .npy index file (EOF"),
    "index truncated": (
        lambda f: (f / IDX).write_bytes((f / IDX).read_bytes()[:-40]),
        IDX,
        "(truncated or padded)",
    ),
    "index of 10**12 items": (
        lambda f: (f / IDX).write_bytes(npy((10**12,), data=bytes(64))),
        IDX,
        "header says 1000000000000 int64 items",
    ),
    "index header of 2 GiB": (
        lambda f: (f / IDX).write_bytes(b"\x93NUMPY\x02\x00" + struct.pack("<I", 2**31) + b"{"),
        IDX,
        "not a .npy index file",
    ),
    "index header of 20 kB": (
        lambda f: (f / IDX).write_bytes(npy((3,), pad=20_000, data=bytes(24))),
        IDX,
        "is large and may not be safe",
    ),
    "index of objects": (
        lambda f: np.save(f / IDX, np.array([0, "x"], dtype=object), allow_pickle=True),
        IDX,
        "not object of shape",
    ),
    "index of floats": (
        lambda f: np.save(f / IDX, np.array([0.0, 5.0])),
        IDX,
        "1-D integer array, not float64",
    ),
    "index not numpy": (
        lambda f: (f / IDX).write_bytes(b"hello world" * 5),
        IDX,
        "the magic string is not correct",
    ),
    "shard truncated": (
        lambda f: (f / BIN).write_bytes((f / BIN).read_bytes()[:-3]),
        BIN,
        "bytes, but meta.json says",
    ),
    "shard read as uint32": (
        lambda f: edit_meta(f, dtype="uint32"),
        BIN,
        "bytes, but meta.json says 34214 uint32 tokens",
    ),
    "shard named with a NUL": (
        lambda f: edit_meta(f, shards=[{"bin": "train/a\0b", "idx": IDX, "tokens": 1}]),
        "meta.json",
        "key 'shards'[0].bin must be a file name",
    ),
    "shard name too long": (
        lambda f: edit_meta(f, shards=[{"bin": "a" * 5000, "idx": IDX, "tokens": 1}]),
        "a" * 100,
        "File name too long",
    ),
    "tokenizer not a string": (
        lambda f: edit_meta(f, tokenizer=5),
        "meta.json",
        "key 'tokenizer' must be a file name",
    ),
    "eos past the vocabulary": (
        lambda f: edit_meta(f, eos_id=10**30),
        "meta.json",
        "key 'eos_id' 1000000000000000000000000000000 is not below",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_is_one_dataset_error_naming_it(corpus, tmp_path, case):
    mutate, name, part = HOSTILE[case]
    folder = copy(corpus, tmp_path)
    mutate(folder)
    with pytest.raises(DatasetError) as exc:
        TokenShards(folder)
    message = str(exc.value)
    assert message.startswith(str(folder / name)) and part in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    "write, part",
    [
        (lambda p: p.write_bytes(b""), "not a .npy prompt lengths file (EOF"),
        (lambda p: p.write_bytes(npy((10**12,))), "header says 1000000000000 int64 items"),
        (
            lambda p: np.save(p, np.array([1, "x"], dtype=object), allow_pickle=True),
            "1-D integer array, not object",
        ),
    ],
)
def test_hostile_prompt_lengths_are_one_dataset_error(corpus, tmp_path, write, part):
    folder = copy(corpus, tmp_path)
    write(folder / LENGTHS)
    with pytest.raises(DatasetError, match=f"^{folder / LENGTHS}: .*") as exc:
        TokenShards(folder).prompts()
    assert part in str(exc.value)


def test_a_missing_dataset_is_one_line_and_still_a_file_not_found_error(tmp_path):
    with pytest.raises(DatasetMissing, match="run: milarun dataset llm_corpus") as exc:
        require(tmp_path, "llm_corpus")
    assert isinstance(exc.value, FileNotFoundError)


def run(argv, capsys):
    """``milarun ARGV`` in this process: (exit status, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize("verbose", [False, True])
def test_milarun_run_on_a_hostile_shard_is_a_fail_record_and_one_line(
    corpus, tmp_path, capsys, verbose
):
    folder = copy(corpus, tmp_path)
    (folder / IDX).write_bytes(npy((10**12,), data=bytes(64)))
    out = tmp_path / "r.json"
    code, err = run(
        [
            "run",
            *(["--verbose"] if verbose else []),
            "milarun.models.llm_pretrain:main",
            "-o",
            out,
            "-d",
            folder.parent,
            "--",
            *TRAIN,
        ],
        capsys,
    )
    record = json.loads(out.read_text())
    assert code == 1 and record["success"] is False
    error = record["error"]
    assert error["reason"] == "error" and error["type"] == "DatasetError"
    assert error["message"].startswith(f"{folder / IDX}: ")
    assert "Traceback" in error["traceback"]  # the record keeps it
    line = f"milarun: error: {error['message']}"
    if verbose:
        assert "Traceback" in err and line not in err
    else:
        assert "Traceback" not in err, err
        assert [x for x in err.splitlines() if x.startswith("milarun: error")] == [line]


def test_milarun_run_without_a_dataset_is_one_line(tmp_path, capsys):
    code, err = run(
        [
            "run",
            "milarun.models.llm_pretrain:main",
            "-o",
            tmp_path / "r.json",
            "-d",
            tmp_path,
            "--",
            *TRAIN,
        ],
        capsys,
    )
    assert code == 1 and "Traceback" not in err, err
    assert (
        f"milarun: error: dataset llm_corpus is missing or incomplete in {tmp_path / 'llm_corpus'}"
    ) in err
