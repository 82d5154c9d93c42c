"""recom: neural collaborative filtering (NeuMF = GMF + MLP) on MovieLens.

Implicit-feedback NCF as in the MLPerf recommendation reference: every rating
is a positive (user, movie) pair; each user's latest rating is held out (leave
one out) and the rest train the model. Every epoch draws ``--negatives``
random movies per positive as negatives (label 0), shuffles positives and
negatives on the device, and feeds mini-batches to NeuMF: a generalised
matrix factorisation branch (``--factors``) and an MLP branch (``--layers``)
whose outputs are concatenated into one logit; loss is binary cross-entropy.

Data: ``<dataroot>/movielens/ml-20m/ratings.csv``, read with pandas by
``milarun.datasets.movielens.load_ratings`` at start-up, ids renumbered
densely.

Stresses: embedding gathers and scatter-adds (memory bandwidth, random
access), small MLP matmuls, and per-epoch negative sampling on the device.
An **item is one training example** (a positive or a negative pair).
"""

import numpy as np
import torch
from coleo import Option, default, tooled
from torch import nn

from ..bench import dataloop, init_torch
from ..bench.options import batch_size_option, lr_option, precision_option
from ..bench.step import MixedPrecisionStep, make_optimizer
from ..datasets import require
from ..datasets.movielens import load_ratings


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.recom:main -d DATAROOT -- ARGS``.

    Needs dataset ``movielens``. Items are training examples.
    """
    exp.cli(train, argv)


def leave_one_out(df):
    """Split ratings: each user's latest rating → test, the rest → train.

    Returns ``(train_users, train_items, test_users, test_items, n_users,
    n_items)`` as numpy int64 arrays and counts, with ids renumbered densely
    from 0.
    """
    users, uidx = np.unique(df["userId"].to_numpy(), return_inverse=True)
    items, iidx = np.unique(df["movieId"].to_numpy(), return_inverse=True)
    ts = df["timestamp"].to_numpy()
    order = np.lexsort((ts, uidx))
    u, i = uidx[order], iidx[order]
    last = np.r_[u[1:] != u[:-1], True]
    return (u[~last], i[~last], u[last], i[last], len(users), len(items))


class NegativeSampledEpochs:
    """Iterable over the mini-batches of one epoch, built on the device.

    Each epoch: positives plus ``negatives`` random items per positive,
    shuffled with ``randperm``; yields ``(users, items, labels)`` slices.
    """

    def __init__(self, users, items, n_items, negatives, batch_size, device, generator):
        self.users, self.items = users, items
        self.n_items, self.negatives = n_items, negatives
        self.batch_size, self.device, self.gen = batch_size, device, generator

    def __iter__(self):
        n = self.users.numel()
        neg_users = self.users.repeat(self.negatives)
        neg_items = torch.randint(
            0, self.n_items, (n * self.negatives,), device=self.device, generator=self.gen
        )
        users = torch.cat([self.users, neg_users])
        items = torch.cat([self.items, neg_items])
        labels = torch.cat(
            [torch.ones(n, device=self.device), torch.zeros(n * self.negatives, device=self.device)]
        )
        perm = torch.randperm(users.numel(), device=self.device, generator=self.gen)
        users, items, labels = users[perm], items[perm], labels[perm]
        bs = self.batch_size
        for lo in range(0, users.numel(), bs):
            yield users[lo : lo + bs], items[lo : lo + bs], labels[lo : lo + bs]


class NeuMF(nn.Module):
    """NeuMF: the GMF branch (the product of ``factors``-wide user and item embeddings)
    and the MLP branch (over concatenated embeddings, ``layers`` wide) concatenated into
    one logit."""

    def __init__(self, n_users, n_items, factors, layers, dropout):
        super().__init__()
        half = layers[0] // 2
        self.gmf_user = nn.Embedding(n_users, factors)
        self.gmf_item = nn.Embedding(n_items, factors)
        self.mlp_user = nn.Embedding(n_users, half)
        self.mlp_item = nn.Embedding(n_items, half)
        mlp = []
        width = 2 * half
        for w in layers[1:]:
            mlp += [nn.Linear(width, w), nn.ReLU()]
            if dropout:
                mlp.append(nn.Dropout(dropout))
            width = w
        self.mlp = nn.Sequential(*mlp)
        self.out = nn.Linear(factors + width, 1)
        for emb in (self.gmf_user, self.gmf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(emb.weight, 0.0, 0.01)

    def forward(self, u, i):
        gmf = self.gmf_user(u) * self.gmf_item(i)
        mlp = self.mlp(torch.cat([self.mlp_user(u), self.mlp_item(i)], dim=1))
        return self.out(torch.cat([gmf, mlp], dim=1)).squeeze(1)


@tooled
def train(exp):
    batch_size = batch_size_option(default=65536)
    # Size of the GMF embeddings
    factors: Option & int = default(64)
    # MLP layer widths, comma separated (the first is the concatenated embedding size)
    layers: Option = default("256,256,128,64")
    # Negative examples drawn per positive each epoch
    negatives: Option & int = default(4)
    # Dropout in the MLP
    dropout: Option & float = default(0.0)
    lr = lr_option(default=0.0045)
    precision = precision_option(default="fp32")

    device = init_torch(exp)
    mp = MixedPrecisionStep(device, precision)
    autocast = mp.autocast
    widths = [int(w) for w in str(layers).split(",") if w.strip()]
    if not widths or widths[0] % 2:
        raise ValueError("--layers must start with an even width, e.g. 256,256,128,64")
    df = load_ratings(require(exp.dataroot, "movielens"))
    tr_u, tr_i, _, _, n_users, n_items = leave_one_out(df)
    users = torch.from_numpy(tr_u).to(device)
    items = torch.from_numpy(tr_i).to(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(exp.options["seed"])
    epochs = NegativeSampledEpochs(users, items, n_items, negatives, batch_size, device, gen)

    net = NeuMF(n_users, n_items, factors, widths, dropout).to(device)
    optimizer = make_optimizer("Adam", net.parameters(), device, lr=lr, betas=(0.25, 0.5), eps=1e-8)
    criterion = nn.BCEWithLogitsLoss()
    net.train()
    exp.metrics.update({"users": n_users, "movies": n_items, "train_ratings": int(users.numel())})

    for step, (u, i, y) in dataloop(exp, epochs):
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = net(u, i)
            loss = criterion(logits.float(), y)
        mp(loss, optimizer)
        step.set_count(y.numel())
        step.log(loss=loss.detach())
