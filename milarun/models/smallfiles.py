"""smallfiles: list and read an ImageNet-style folder of small files from every node at once.

The access pattern that hurts a parallel filesystem: many small files, each an open, a
read and a close, and a listing of the whole tree by every rank at once (as
``torchvision.datasets.ImageFolder`` lists its root on every rank of a data-parallel job),
each request going to the metadata servers. Runs as ``njobs``, ``multi-node`` or
``node-progression`` under torchrun; alone, a world of one.

**The folder.** By default the test makes its own: in a fresh subfolder
``milarun-smallfiles-<unique>`` of ``--folder`` (default: the dataroot; every rank must see
it, :func:`milarun.models.checkpoint.shared_workdir`), ``--files`` files of
``--file-size`` bytes (default 110,000 B: ILSVRC-2012's training set is about 140 GB over
1,281,167 JPEGs, about 110 KB each) in ``--classes`` class folders
(``n00000000/0000000.bin``…, as ``fake_imagenet``), random bytes (a compressing filesystem
cannot shrink them). Each rank creates every ``world``-th file (timed: the ``create``
figures), then syncs and drops them from the page cache, untimed. The subfolder is removed
at the end, after a failure too. With ``--dataset PATH`` (absolute, or under the dataroot:
``fake_imagenet/train``, built by ``milarun dataset fake_imagenet``) the test reads that
folder instead and writes nothing.

**A round** (``--repeat`` of them, after a barrier each): every rank **lists** the whole
tree (``os.scandir`` recursively and a ``stat`` of every file: the ``list`` figures), then
**reads** its share (every ``world``-th file of the listing in an order shuffled by
``--seed``; each file opened, read whole and closed: the ``read`` figures). A rank that
lists another number of files than there are, or reads another number of bytes than it
listed, stops the test (one error line, reason ``error``).

**The figures** (``metrics``; seconds, files/s, MB/s with MB = 1e6 bytes; the median over
the rounds): ``create_s``, ``create_files_per_s``, ``create_mbps`` (all ranks' files over the
slowest rank's time); ``list_s`` (the slowest rank), ``list_files_per_s_per_rank`` (the
files over a rank's time, the mean over ranks), ``list_files_per_s_aggregate`` (files
listed by all ranks over the slowest time); ``read_s``, ``read_files_per_s_aggregate``,
``read_mbps_aggregate`` (all ranks' files and bytes over the slowest rank's time),
``read_files_per_s_per_rank`` and ``read_files_per_s_rank_min``, ``read_files_per_s_per_node``
and ``read_files_per_s_node_min`` (a node's ranks' files over its slowest time); ``files``,
``bytes``, ``mean_file_bytes``.

**The page cache.** Before each round's read every rank drops the pages of its share:
``fsync`` and ``posix_fadvise(POSIX_FADV_DONTNEED)`` on each file (unprivileged, clean
pages only), or with ``--drop-caches`` and root, ``3`` written to
``/proc/sys/vm/drop_caches`` by each node's first rank (the page cache, dentries and
inodes: the listing then starts cold too). ``page_cache_method`` says which was used,
``drop_caches_refused: true`` that ``--drop-caches`` could not be (not root, a read-only
``/proc/sys``: ``fadvise`` ran instead), ``page_cache_resident_fraction`` (the largest
share of pages still in memory over up to 64 files of the share, ``mincore(2)``) and
``page_cache_dropped`` whether the drop worked. ``fadvise`` opens every file once, which
leaves its directory entry and inode cached: the listing and the opens then measure warm
metadata; only ``drop_caches`` makes them cold.

**Space.** Before anything is written, the folder's filesystem must have room for the
files: ``files × (size rounded up to 4 KiB + 4 KiB)`` plus the class folders and
:data:`milarun.models.checkpoint.SPACE_MARGIN` (else a FAIL with reason ``no-space``; a
write that runs out of space, ``ENOSPC``, is the same FAIL). ``--dataset`` needs none.

The rate logger counts **one item per file** created, listed or read (all ranks'), one
sample per phase; the metrics are the figures. ``--max-count`` does not apply.

Raises (as FAIL records): :class:`milarun.models.checkpoint.NoSpace` (``no-space``),
:class:`milarun.models.checkpoint.StorageError` (``error``, one line), ValueError (a bad
option, before anything runs).
"""

import errno
import os
import random
import time

import torch.distributed as dist
from coleo import Option, default, tooled

from ..bench import init_torch
from ..bench.distributed import process_group
from ..bench.experiment import node_name
from . import checkpoint as ckpt
from .checkpoint import NoSpace, Phases, StorageError, agree, median

NO_LOSS = "smallfiles lists and reads files; nothing is trained"
#: Default ``--file-size``: about an ILSVRC-2012 training JPEG (140 GB / 1,281,167).
FILE_SIZE = 110_000
#: ``--files`` and ``--file-size`` bounds.
MAX_FILES = 10_000_000
MAX_FILE_SIZE = 64 * 2**20
#: Files of a rank's share whose residency is sampled after the drop.
RESIDENCY_SAMPLE = 64
BLOCK = 4096


def main(exp, argv):
    """Entry point: under torchrun, ``... -m milarun run milarun.models.smallfiles:main
    -- ARGS``; alone, a world of one.

    Items are files created, listed and read; the figures are ``metrics``.
    """
    exp.cli(train, argv)


def space_needed(files, file_size, classes):
    """Bytes the created folder needs on disk (module docstring), margin included."""
    per_file = -(-file_size // BLOCK) * BLOCK + BLOCK
    return files * per_file + (classes + 1) * BLOCK + ckpt.SPACE_MARGIN


def file_path(root, i, classes):
    """The path of file ``i`` of the created folder (class ``i mod classes``)."""
    return os.path.join(root, f"n{i % classes:08d}", f"{i:07d}.bin")


@tooled
def train(exp):
    # Files to create (1 to 10000000)
    files: Option & int = default(20000)
    # Bytes of each file (1 to 67108864; default: an ImageNet JPEG's mean, about 110 KB)
    file_size: Option & int = default(FILE_SIZE)
    # Class folders the files are spread over (1 to 100000)
    classes: Option & int = default(100)
    # Folder of the shared filesystem the files are created under, in a fresh subfolder
    # removed at the end (default: the dataroot)
    folder: Option = default("")
    # An existing folder to read instead of creating one (absolute, or under the dataroot,
    # e.g. fake_imagenet/train); nothing is written
    dataset: Option = default("")
    # Rounds of listing then reading (1 to 1000); the figures are their medians
    repeat: Option & int = default(1)
    # Drop the node's page cache, dentries and inodes through /proc/sys/vm/drop_caches
    # before each read (root only; else, and by default, posix_fadvise DONTNEED per file)
    drop_caches: Option & bool = default(False)

    if not 1 <= files <= MAX_FILES:
        raise ValueError(f"--files must be between 1 and {MAX_FILES}, not {files}")
    if not 1 <= file_size <= MAX_FILE_SIZE:
        raise ValueError(f"--file-size must be between 1 and {MAX_FILE_SIZE} B, not {file_size}")
    if not 1 <= classes <= 100_000:
        raise ValueError(f"--classes must be between 1 and 100000, not {classes}")
    if not 1 <= repeat <= 1000:
        raise ValueError(f"--repeat must be between 1 and 1000, not {repeat}")
    if dataset:
        if not os.path.isabs(dataset):
            if not exp.dataroot:
                raise ValueError(f"--dataset {dataset} is relative and there is no dataroot")
            dataset = os.path.join(exp.dataroot, dataset)
        if not os.path.isdir(dataset):
            raise StorageError(f"--dataset {dataset}: no such folder")
    else:
        folder = folder or exp.dataroot
        if not folder:
            raise ValueError("--folder is not given and there is no dataroot to default to")
        folder = os.path.abspath(folder)
    device = init_torch(exp)
    with process_group(exp, device, "gloo") as world:
        spec = (files, file_size, classes)
        run_smallfiles(exp, world, spec, folder, dataset, repeat, drop_caches)


def run_smallfiles(exp, world, spec, folder, dataset, repeat, drop_caches):
    """Create (or take) the folder, then the rounds of the module docstring; the created
    subfolder is removed at the end whatever happens."""
    files, file_size, classes = spec
    m = exp.metrics
    seed = exp.options["seed"]
    work, ok = None, False
    m["repeat"] = repeat
    if dataset:
        m.update({"dataset": dataset, "space_needed_bytes": 0})
    else:
        need = space_needed(files, file_size, classes)
        m.update({"folder": folder, "file_size": file_size, "classes": classes})
        m["space_needed_bytes"] = need
        work = ckpt.shared_workdir(world, folder, "smallfiles", need)
    try:
        phases = Phases(exp, world)
        if work is not None:
            _create(exp, world, phases, work, spec, seed)
        root = work or dataset
        expected = files if work is not None else None
        rounds = []
        for _ in range(repeat):
            rounds.append(_round(exp, world, phases, root, expected, drop_caches, seed))
            _summarise(m, rounds, "list", "read")
        phases.close()
        ok = True
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NoSpace(
                f"{folder} ran out of space during the test ({exc.strerror}); figures so far "
                "in metrics"
            ) from exc
        raise
    finally:
        gone = ckpt.remove_workdir(world, work, ok)
        if world.rank == 0 and work is not None:
            m["cleaned_up"] = gone


def _gather(world, figures):
    if world.size == 1:
        return [figures]
    out = [None] * world.size
    dist.all_gather_object(out, figures)
    return out


def _create(exp, world, phases, root, spec, seed):
    """Every rank creates its share of the files (timed), then syncs them and drops their
    pages (untimed)."""
    files, file_size, classes = spec
    if world.rank == 0:
        for c in range(min(classes, files)):
            os.mkdir(os.path.join(root, f"n{c:08d}"))
    if world.size > 1:
        dist.barrier()
    # random bytes: file i is a window of one random block (seeded by seed and rank)
    rng = random.Random(ckpt._seed_of(seed, world.rank, "smallfiles"))
    block = rng.randbytes(file_size + BLOCK)
    mine = range(world.rank, files, world.size)
    phases.start()
    t0 = time.perf_counter()
    written, problem = _guarded(_write_files, root, mine, classes, block, file_size)
    create_s = time.perf_counter() - t0
    agree(world, problem)
    node = node_name(exp.result.get("node"))
    figures = _gather(world, {"node": node, "files": len(mine), "bytes": written, "s": create_s})
    phases.done(sum(f["files"] for f in figures))
    slowest = max(f["s"] for f in figures)
    exp.metrics["create_s"] = slowest
    if slowest > 0:
        exp.metrics["create_files_per_s"] = sum(f["files"] for f in figures) / slowest
        exp.metrics["create_mbps"] = sum(f["bytes"] for f in figures) / slowest / 1e6
    for i in mine:  # untimed: written to storage, then out of the page cache
        ckpt.drop_file_pages(file_path(root, i, classes))


def _guarded(fn, *args):
    """``(fn(*args), None)``, or ``(None, problem)`` when it raised an ``OSError``: the
    problem :func:`milarun.models.checkpoint.agree` takes, so that every rank stops
    (``no-space`` for ``ENOSPC``, else a one-line error)."""
    try:
        return fn(*args), None
    except OSError as exc:
        cls = NoSpace if exc.errno == errno.ENOSPC else StorageError
        where = f" ({exc.filename})" if exc.filename else ""
        return None, (cls, f"{exc.strerror or exc}{where}; figures so far in metrics")


def _write_files(root, indices, classes, block, size):
    """Write the files ``indices`` (a plain loop: coleo instruments a tooled one); returns
    the bytes written."""
    total = 0
    view = memoryview(block)
    for i in indices:
        start = i % BLOCK
        with open(file_path(root, i, classes), "wb") as f:
            total += f.write(view[start : start + size])
    return total


def list_tree(root):
    """Every file under ``root`` (recursively, ``os.scandir``, symlinks not followed) as
    ``[(path, size)]``, sorted by path; hidden entries (``.name``) are left out."""
    out = []
    todo = [root]
    while todo:
        here = todo.pop()
        with os.scandir(here) as it:
            for entry in it:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    out.append((entry.path, entry.stat(follow_symlinks=False).st_size))
    out.sort()
    return out


def read_files(paths):
    """Open, read whole and close every file of ``paths``; returns the bytes read."""
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(4 * 2**20):
                total += len(chunk)
    return total


def _round(exp, world, phases, root, expected, drop_caches, seed):
    """One listing and read of ``root`` by every rank; returns every rank's figures."""
    node = node_name(exp.result.get("node"))
    if world.size > 1:
        dist.barrier()
    phases.start()
    t0 = time.perf_counter()
    listing, problem = _guarded(list_tree, root)
    list_s = time.perf_counter() - t0
    agree(world, problem)
    listed = _gather(world, len(listing))
    phases.done(sum(listed))
    problem = None
    want = expected if expected is not None else listed[0]
    if len(listing) != want or not listing:
        problem = (
            StorageError,
            f"{root}: node {node} lists {len(listing)} files where there are {want}",
        )
    agree(world, problem)
    order = list(range(len(listing)))
    random.Random(seed).shuffle(order)
    share = [listing[i] for i in order[world.rank :: world.size]]
    paths = [p for p, _ in share]
    # the page cache: this rank's share out of it before the read
    method, refused = ckpt.drop_pages(world, paths, drop_caches, 3)
    if refused:
        exp.metrics["drop_caches_refused"] = True
    resident = ckpt.max_known(ckpt.resident_fraction(p) for p in paths[:RESIDENCY_SAMPLE])
    if world.size > 1:
        dist.barrier()
    phases.start()
    t0 = time.perf_counter()
    got, problem = _guarded(read_files, paths)
    read_s = time.perf_counter() - t0
    agree(world, problem)
    want_bytes = sum(s for _, s in share)
    figures = _gather(
        world,
        {
            "node": node,
            "listed": len(listing),
            "list_s": list_s,
            "files": len(paths),
            "bytes": got,
            "read_s": read_s,
            "method": method,
            "resident": resident,
        },
    )
    phases.done(sum(f["files"] for f in figures))
    problem = None
    if got != want_bytes:
        problem = (StorageError, f"{root}: node {node} read {got} B of the {want_bytes} B listed")
    agree(world, problem)
    return figures


def _rate(n, s):
    return n / s if s > 0 else None


def _summarise(m, rounds, list_key, read_key):
    """Into the metrics ``m``, the medians over ``rounds`` of the module docstring's list
    and read figures; the page-cache method of the last round."""
    per = []
    for ranks in rounds:
        list_s = max(f["list_s"] for f in ranks)
        read_s = max(f["read_s"] for f in ranks)
        files = sum(f["files"] for f in ranks)
        nbytes = sum(f["bytes"] for f in ranks)
        out = {
            f"{list_key}_s": list_s,
            f"{list_key}_files_per_s_aggregate": _rate(sum(f["listed"] for f in ranks), list_s),
            f"{read_key}_s": read_s,
            f"{read_key}_files_per_s_aggregate": _rate(files, read_s),
            f"{read_key}_mbps_aggregate": _rate(nbytes / 1e6, read_s),
            "page_cache_resident_fraction": ckpt.max_known(f["resident"] for f in ranks),
        }
        listing = ckpt.spread(ranks, "listed", "list_s")
        if "per_rank" in listing:
            out[f"{list_key}_files_per_s_per_rank"] = listing["per_rank"]
        for name, rate in ckpt.spread(ranks, "files", "read_s").items():
            out[f"{read_key}_files_per_s_{name}"] = rate
        per.append(out)
    for key in per[-1]:
        value = median(p.get(key) for p in per)
        if value is not None:
            m[key] = value
    last = rounds[-1]
    methods = {f["method"] for f in last}
    m["page_cache_method"] = methods.pop() if len(methods) == 1 else "mixed"
    m["page_cache_dropped"] = ckpt.dropped(m)
    m["files"] = last[0]["listed"]
    m["bytes"] = sum(f["bytes"] for f in last)
    m["mean_file_bytes"] = m["bytes"] / m["files"] if m["files"] else 0
    m["nodes"] = len({f["node"] for f in last})
