"""translator: sequence-to-sequence Transformer on WMT16 English→German.

A ``torch.nn.Transformer`` (pre-norm off, batch first) with a shared
source/target embedding tied to the output projection and sinusoidal
positions, trained with teacher forcing: the decoder reads ``<s> y`` and
predicts ``y </s>``; the loss is label-smoothed cross-entropy that ignores
padding. Optimiser: Adam with the inverse-square-root warm-up schedule.

Data: ``<dataroot>/wmt16/train.tok.clean.bpe.32000.{en,de}`` and
``vocab.bpe.32000``, read and encoded at start-up by
``milarun.datasets.wmt16.ParallelCorpus``. Every epoch the pairs are grouped
into batches of similar lengths; a ``DataLoader`` (``--workers``) pads them
and adds BOS/EOS in its collate function, so batch assembly runs each step.

Stresses: attention and feed-forward matmuls (compute), the 32k-wide
softmax, and the host-side batching pipeline. An **item is one target
token** (non-padding tokens of ``y </s>``), so batches of different lengths
count fairly.
"""

import math

import torch
from coleo import Option, default, tooled
from torch import nn

from ..bench import data_loader, dataloop, init_torch
from ..bench import device as bench_device
from ..bench.options import batch_size_option, lr_option, precision_option, workers_option
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..datasets import require
from ..datasets.wmt16 import ParallelCorpus


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.translator:main -d DATAROOT -- ARGS``.

    Needs dataset ``wmt16``. Items are target tokens.
    """
    exp.cli(train, argv)


class Collate:
    """Pads a list of (src ids, tgt ids) pairs into int64 tensors.

    Returns ``(src, tgt_in, tgt_out, n_tokens)``: ``src`` is ``x </s>``,
    ``tgt_in`` is ``<s> y``, ``tgt_out`` is ``y </s>``, each padded with
    ``pad`` to the batch's longest sequence; ``n_tokens`` counts the
    non-padding entries of ``tgt_out``.
    """

    def __init__(self, pad, bos, eos):
        self.pad, self.bos, self.eos = pad, bos, eos

    def __call__(self, pairs):
        n = len(pairs)
        ls = max(len(s) for s, _ in pairs) + 1
        lt = max(len(t) for _, t in pairs) + 1
        src = torch.full((n, ls), self.pad, dtype=torch.int64)
        tin = torch.full((n, lt), self.pad, dtype=torch.int64)
        tout = torch.full((n, lt), self.pad, dtype=torch.int64)
        ntok = 0
        for i, (s, t) in enumerate(pairs):
            src[i, : len(s)] = torch.tensor(s)
            src[i, len(s)] = self.eos
            tt = torch.tensor(t)
            tin[i, 0] = self.bos
            tin[i, 1 : len(t) + 1] = tt
            tout[i, : len(t)] = tt
            tout[i, len(t)] = self.eos
            ntok += len(t) + 1
        return src, tin, tout, ntok


class PairDataset:
    """Index → (src ids, tgt ids) over a ``ParallelCorpus``."""

    def __init__(self, corpus):
        self.corpus = corpus

    def __len__(self):
        return len(self.corpus)

    def __getitem__(self, i):
        return self.corpus.src[i], self.corpus.tgt[i]


class EpochBatches:
    """Batch sampler: a fresh length-bucketed batch order every epoch."""

    def __init__(self, corpus, batch_size, seed):
        self.corpus, self.batch_size, self.seed = corpus, batch_size, seed
        self.epoch = 0
        self._len = len(corpus.length_batches(batch_size, seed))

    def __len__(self):
        return self._len

    def __iter__(self):
        batches = self.corpus.length_batches(self.batch_size, self.seed + self.epoch)
        self.epoch += 1
        return iter(batches)


class Seq2Seq(nn.Module):
    """The encoder-decoder Transformer over one shared embedding (tied to the output
    projection) with sinusoidal positions."""

    def __init__(self, vocab, d_model, nhead, layers, ff, dropout, pad, max_len=512):
        super().__init__()
        self.pad = pad
        self.scale = math.sqrt(d_model)
        self.embed = nn.Embedding(vocab, d_model, padding_idx=pad)
        nn.init.normal_(self.embed.weight, 0, d_model**-0.5)
        pos = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        self.register_buffer("pe", pe, persistent=False)
        self.drop = nn.Dropout(dropout)
        self.transformer = nn.Transformer(
            d_model, nhead, layers, layers, ff, dropout, batch_first=True
        )

    def embed_pos(self, x):
        return self.drop(self.embed(x) * self.scale + self.pe[: x.size(1)])

    def forward(self, src, tgt_in):
        # tgt_is_causal=True says the mask is causal: without it, every forward of
        # nn.TransformerDecoder compares the mask with a fresh causal one and reads
        # the answer on the host (bool(tensor)), a device sync per step.
        mask = self.transformer.generate_square_subsequent_mask(
            tgt_in.size(1), device=src.device, dtype=torch.bool
        )
        src_pad = src == self.pad
        out = self.transformer(
            self.embed_pos(src),
            self.embed_pos(tgt_in),
            tgt_mask=mask,
            tgt_is_causal=True,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_in == self.pad,
            memory_key_padding_mask=src_pad,
        )
        return out @ self.embed.weight.t()


@tooled
def train(exp):
    batch_size = batch_size_option(default=64)
    # Model width (embedding and attention size)
    d_model: Option & int = default(512)
    # Attention heads
    nhead: Option & int = default(8)
    # Encoder layers (the decoder has as many)
    layers: Option & int = default(6)
    # Feed-forward width
    ff: Option & int = default(2048)
    # Dropout
    dropout: Option & float = default(0.1)
    # Label smoothing of the cross-entropy
    label_smoothing: Option & float = default(0.1)
    lr = lr_option(default=5e-4)  # the peak of the inverse square-root schedule (Adam)
    # Warm-up steps of the learning-rate schedule
    lr_warmup: Option & int = default(4000)
    # Longest sentence kept, in subword tokens (longer pairs are dropped)
    max_len: Option & int = default(80)
    workers = workers_option(default=-1)
    precision = precision_option(default="fp32")

    device = init_torch(exp)
    mp = MixedPrecisionStep(device, precision)
    autocast = mp.autocast
    corpus = ParallelCorpus(require(exp.dataroot, "wmt16"), "train", max_len=max_len)
    if len(corpus) == 0:
        raise ValueError("no training pair is shorter than --max-len")
    vocab = corpus.vocab
    loader = data_loader(
        PairDataset(corpus),
        batch_size,
        workers,
        device,
        batch_sampler=EpochBatches(corpus, batch_size, exp.options["seed"]),
        collate_fn=Collate(vocab.pad, vocab.bos, vocab.eos),
    )

    net = Seq2Seq(
        len(vocab), d_model, nhead, layers, ff, dropout, vocab.pad, max_len=max_len + 2
    ).to(device)
    optimizer = make_optimizer("Adam", net.parameters(), device, lr=lr, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / lr_warmup, math.sqrt(lr_warmup / (s + 1)))
    )
    criterion = torch.nn.CrossEntropyLoss(ignore_index=vocab.pad, label_smoothing=label_smoothing)
    net.train()
    exp.metrics.update(
        {"vocab": len(vocab), "train_pairs": len(corpus), "workers": loader.num_workers}
    )

    nb = bench_device.is_cuda(device)
    for step, (src, tin, tout, ntok) in dataloop(exp, loader):
        src, tin, tout = [t.to(device, non_blocking=nb) for t in (src, tin, tout)]
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = net(src, tin)
            loss = criterion(logits.float().view(-1, logits.size(-1)), tout.view(-1))
        mp(loss, optimizer)
        schedule.step()
        step.set_count(ntok)
        step.log(loss=loss.detach())
