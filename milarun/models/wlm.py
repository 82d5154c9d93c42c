"""wlm: word-level language model on WikiText-2 (tests ``wlm`` and ``wlmfp16``).

An embedding, a recurrent network (``--model LSTM``, ``GRU``, ``RNN_TANH``
or ``RNN_RELU``) and a linear decoder over the vocabulary, trained with
truncated back-propagation through time (``--bptt`` steps, hidden state
carried over and detached between batches) and gradient clipping, as in
PyTorch's classic ``word_language_model`` example.

Data: ``<dataroot>/wikitext2/wiki.train.tokens``, read and tokenised at
start-up by ``milarun.datasets.wikitext2.Corpus`` (whitespace split plus
``<eos>`` per line), then laid out as ``--batch-size`` columns on the device.

Stresses: small sequential recurrent kernels (latency bound at small sizes),
the vocabulary-wide softmax (memory bandwidth), and start-up tokenisation on
the CPU. An **item is one token** (``batch_size × seq_len`` per step).
"""

import torch
from coleo import Option, default, tooled
from torch import nn

from ..bench import dataloop, init_torch
from ..bench import device as bench_device
from ..bench.options import batch_size_option, lr_option, precision_option
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..datasets import require
from ..datasets.wikitext2 import Corpus


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.wlm:main -d DATAROOT -- ARGS``.

    Needs dataset ``wikitext2``. Items are tokens.
    """
    exp.cli(train, argv)


class RNNModel(nn.Module):
    """Encoder embedding → recurrent stack → decoder (optionally tied)."""

    def __init__(self, kind, ntoken, ninp, nhid, nlayers, dropout, tied):
        super().__init__()
        self.kind = kind
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if kind in ("LSTM", "GRU"):
            self.rnn = getattr(nn, kind)(ninp, nhid, nlayers, dropout=dropout)
        elif kind in ("RNN_TANH", "RNN_RELU"):
            self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=kind[4:].lower(), dropout=dropout)
        else:
            raise ValueError(f"--model must be LSTM, GRU, RNN_TANH or RNN_RELU, not {kind!r}")
        self.decoder = nn.Linear(nhid, ntoken)
        if tied:
            if nhid != ninp:
                raise ValueError("--tied needs --nhid equal to --emsize")
            self.decoder.weight = self.encoder.weight
        self.nhid, self.nlayers = nhid, nlayers
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, x, hidden):
        emb = self.drop(self.encoder(x))
        out, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(out)), hidden

    def init_hidden(self, bsz, device):
        shape = (self.nlayers, bsz, self.nhid)
        if self.kind == "LSTM":
            return (torch.zeros(shape, device=device), torch.zeros(shape, device=device))
        return torch.zeros(shape, device=device)


class BPTTBatches:
    """One epoch of ``(input, target)`` windows of ``bptt`` time steps over
    ``data`` (shape ``[steps, batch]``); the last window may be shorter."""

    def __init__(self, data, bptt):
        self.data = data
        self.bptt = bptt

    def __iter__(self):
        data, bptt = self.data, self.bptt
        for i in range(0, data.size(0) - 1, bptt):
            n = min(bptt, data.size(0) - 1 - i)
            yield data[i : i + n], data[i + 1 : i + 1 + n]


def cpu_bf16_lstm_supported():
    """Whether this CPU can run a bf16 LSTM under autocast (bool).

    PyTorch runs a CPU LSTM through oneDNN, whose bf16 LSTM needs AVX-512: on
    an AVX2-only CPU (e.g. AMD Zen 1-3) the first step raises "could not create
    a primitive descriptor". The probe runs one forward pass of a 1-unit LSTM.
    """
    rnn = torch.nn.LSTM(1, 1)
    try:
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            rnn(torch.zeros(1, 1, 1))
    except RuntimeError:
        return False
    return True


BF16_LSTM_REFUSED = (
    "--precision bf16 with --model LSTM needs a CPU whose oneDNN runs bf16 "
    "LSTMs (AVX-512); this one does not: use GRU or fp32"
)


def _detach(h):
    if isinstance(h, tuple):
        return tuple(x.detach() for x in h)
    return h.detach()


@tooled
def train(exp):
    # Recurrent cell: LSTM, GRU, RNN_TANH or RNN_RELU
    model: Option = default("LSTM")
    # Size of the word embeddings
    emsize: Option & int = default(200)
    # Hidden units per layer
    nhid: Option & int = default(200)
    # Number of recurrent layers
    nlayers: Option & int = default(2)
    lr = lr_option(default=20.0)  # plain SGD, as in the example
    # Gradient clipping norm
    clip: Option & float = default(0.25)
    # Sequence length of truncated back-propagation through time
    bptt: Option & int = default(35)
    batch_size = batch_size_option(default=20)  # parallel token streams (batch columns)
    # Dropout applied to embeddings and RNN outputs
    dropout: Option & float = default(0.2)
    # Tie the decoder weights to the embedding (needs nhid == emsize)
    tied: Option & bool = default(False)
    precision = precision_option(default="fp32")

    device = init_torch(exp)
    mp = MixedPrecisionStep(device, precision)
    autocast = mp.autocast
    if (
        bench_device.kind(device) == "cpu"
        and precision == "bf16"
        and model == "LSTM"
        and not cpu_bf16_lstm_supported()
    ):
        # Refused before training: the failure record then names the cause, not oneDNN's text.
        raise ValueError(BF16_LSTM_REFUSED)
    corpus = Corpus(require(exp.dataroot, "wikitext2"), splits=("train",))
    ntokens = len(corpus.dictionary)
    ids = torch.from_numpy(corpus.train)
    nbatch = ids.size(0) // batch_size
    if nbatch < 2:
        raise ValueError("the training split is too small for --batch-size")
    data = ids[: nbatch * batch_size].view(batch_size, -1).t().contiguous().to(device)

    net = RNNModel(model, ntokens, emsize, nhid, nlayers, dropout, tied).to(device)
    optimizer = make_optimizer("SGD", net.parameters(), device, lr=lr)
    criterion = torch.nn.CrossEntropyLoss()
    net.train()
    hidden = net.init_hidden(batch_size, device)
    exp.metrics.update({"vocab": ntokens, "train_tokens": int(ids.numel())})

    for step, (x, y) in dataloop(exp, BPTTBatches(data, bptt)):
        hidden = _detach(hidden)
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            out, hidden = net(x, hidden)
            loss = criterion(out.view(-1, ntokens).float(), y.reshape(-1))
        mp(loss, optimizer, clip_norm=clip, params=net.parameters())
        step.set_count(y.numel())
        step.log(loss=loss.detach())
