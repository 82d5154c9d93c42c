"""checkpoint: save and restore a sharded model and optimizer state on the shared filesystem.

Every rank at once saves its shard of a model-like state with
``torch.distributed.checkpoint`` (DCP: one ``__<rank>_<i>.distcp`` file per rank and a
``.metadata`` file) into a fresh folder, then loads it back and checks it. Runs as
``njobs`` (a node's GPUs), ``multi-node`` or ``node-progression`` under torchrun; alone, a
world of one.

**The state.** ``--shape`` names a parameter count, Llama 3's published ones (Meta's model
cards): ``1b`` 1,235,814,400 (Llama 3.2 1B), ``8b`` 8,030,261,248 (Llama 3.1 8B), ``70b``
70,553,706,496 (Llama 3.1 70B); ``tiny`` is 2**20 for the tests. A checkpoint of
mixed-precision Adam holds **14 bytes a parameter**: the bf16 weights (2) and the fp32
master weights, first and second moments (4 + 4 + 4). ZeRO (Rajbhandari et al. 2020,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", section 3.1)
counts 16 bytes a parameter in memory: 2 (fp16 weights) + 2 (fp16 gradients) + 12 (K, the
optimizer's fp32 copies); the gradients are not saved. The state is divided evenly over
the ranks (FSDP / ZeRO-3's sharding): ``14 × P / world`` bytes a rank, e.g. the ``70b``
shape is 987.8 GB in all, 15.4 GB a rank over 64 GPUs (8 nodes of 8), 123.5 GB over 8.
``--state-mib`` gives a rank's bytes directly instead. Each rank's tensors are named
``rank<r>.…`` (``model.<i>`` bf16, ``optim.<i>.master|exp_avg|exp_avg_sq`` fp32, at most
:data:`CHUNK_PARAMS` parameters each), so DCP writes every one (no replicated tensor is
de-duplicated); their bytes are random, drawn from ``(--seed, rank, tensor)``, so the state
is the same for the same rank and seed, and a compressing filesystem cannot shrink it. The
tensors live in host memory: the test measures the storage, not a GPU's copy to the host.

**The run.** For each of ``--repeat`` rounds: every rank meets at a barrier, saves
(``dcp.save``; DCP's writer fsyncs every file), and the time from the barrier to the
return of ``save`` is the rank's save time; the sha256 of every file of the rank's shard
is taken; the written files' pages are dropped from the page cache (below); the tensors
are zeroed; after a barrier every rank loads (``dcp.load``) into them, timed the same way;
the sha256 of every loaded tensor is compared with the one taken before the save, and of
every shard file with the one taken after the save. A difference on any rank is a FAIL
with reason ``checkpoint-mismatch`` naming the tensors and their shard file
(:class:`CheckpointMismatch`), with the figures measured so far.

**The figures** (``metrics``, GB = 1e9 bytes, seconds; the median over the rounds):
``save_s`` and ``load_s`` (the slowest rank's time), ``write_gbps_aggregate`` and
``read_gbps_aggregate`` (all ranks' bytes over the slowest rank's time),
``write_gbps_per_node`` / ``read_gbps_per_node`` (each node's ranks' bytes over that node's
slowest time, the mean over nodes; ``…_node_min`` the slowest node),
``write_gbps_per_rank`` / ``read_gbps_per_rank`` (a rank's bytes over its own time, the mean;
``…_rank_min`` the slowest rank), ``bytes_per_rank`` (the largest shard, bytes on disk),
``checkpoint_bytes`` (all files), ``state_bytes_per_rank``, ``params`` and
``bytes_per_param``.

**The page cache.** A read of pages still in memory measures memory, not storage. After
the save, each rank asks the kernel to drop its files' pages: ``posix_fadvise(fd, 0, 0,
POSIX_FADV_DONTNEED)`` on every file it wrote (clean after DCP's fsync; unprivileged).
With ``--drop-caches`` and root, each node's first rank writes ``1`` to
``/proc/sys/vm/drop_caches`` instead (the whole node's page cache; only as root, and only
where ``/proc/sys`` is writable), falling back to ``fadvise`` (``drop_caches_refused:
true`` says so). The record says which was used (``page_cache_method``: ``fadvise``,
``drop_caches`` or ``none``) and whether it worked: ``page_cache_resident_fraction``, the
largest share of a shard file's pages still in memory after the drop (``mincore(2)`` on a
mapping of the file), and ``page_cache_dropped`` (that share below 1 %). A filesystem
whose pages are its storage (tmpfs) keeps them: the record then says
``page_cache_dropped: false``.

**Space and the folder.** ``--folder`` (default: the dataroot) must be a folder every rank
sees: rank 0 creates a fresh subfolder ``milarun-checkpoint-<unique>`` in it and writes a
marker there, every rank reads the marker back (a folder that is not writable, missing or
not shared: one error line, reason ``error``). Before anything is written, the folder's
free space (``statvfs``: available blocks × fragment size) must hold one checkpoint: the
state of every rank plus :data:`SPACE_MARGIN` (else a FAIL with reason ``no-space``, and a
save that runs out of space, ``ENOSPC``, is the same FAIL with the figures so far). Only the
fresh subfolder is written to, and it is removed at the end, after a failure too.

The rate logger counts **one item per byte** saved or loaded (all ranks'), one sample per
save and per load; the metrics are the figures. ``--max-count`` does not apply.

Raises (as FAIL records): :class:`CheckpointMismatch` (``checkpoint-mismatch``),
:class:`NoSpace` (``no-space``), :class:`StorageError` (``error``, one line), ValueError
(a bad option, before anything runs).
"""

import ctypes
import ctypes.util
import errno
import hashlib
import mmap
import os
import shutil
import statistics
import time
import uuid

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from coleo import Option, default, tooled

from ..bench import init_torch, iteration_wrapper
from ..bench.distributed import process_group
from ..bench.experiment import node_name
from ..errors import MilarunError
from ..host.kernel import read_text

NO_LOSS = "checkpoint saves and loads a model's state; nothing is trained"
#: Parameter counts of ``--shape`` (Meta's Llama 3.1 / 3.2 model cards; ``tiny``: tests).
SHAPES = {
    "tiny": 2**20,
    "1b": 1_235_814_400,
    "8b": 8_030_261_248,
    "70b": 70_553_706_496,
}
#: Bytes a parameter in a mixed-precision Adam checkpoint: bf16 weights (2) + fp32 master
#: weights, first and second moments (3 × 4); ZeRO's 16 (section 3.1) less the 2 of the
#: fp16 gradients, which are not saved.
BYTES_PER_PARAM = 14
#: The tensors of a rank hold at most this many parameters each (64 Mi: 128 MiB in bf16,
#: 256 MiB in fp32), as a model's layers split its state.
CHUNK_PARAMS = 64 * 2**20
#: Bytes of margin above the checkpoint's own in the space check: DCP's per-tensor headers
#: (about 1.5 KiB each), the metadata file and filesystem blocks.
SPACE_MARGIN = 64 * 2**20
#: ``--state-mib`` bounds (MiB a rank): 1 MiB to 4 TiB.
MAX_STATE_MIB = 4 * 2**20
#: A drop that leaves less than this share of a file's pages in memory worked.
DROPPED_BELOW = 0.01


class CheckpointMismatch(RuntimeError):
    """A shard read back differs from what was saved: FAIL, reason ``checkpoint-mismatch``."""

    fail_reason = "checkpoint-mismatch"


class NoSpace(MilarunError):
    """The folder's filesystem cannot hold the test's files: FAIL, reason ``no-space``."""

    fail_reason = "no-space"


class StorageError(MilarunError):
    """The folder is missing, not writable or not shared: one error line, reason ``error``."""


def main(exp, argv):
    """Entry point: under torchrun, ``... -m milarun run milarun.models.checkpoint:main
    -- ARGS``; alone, a world of one.

    Items are bytes saved and loaded; the figures are ``metrics`` (module docstring).
    """
    exp.cli(train, argv)


# --- hooks the tests patch -------------------------------------------------------------


def free_bytes(path):
    """Bytes available to an unprivileged user on ``path``'s filesystem (``statvfs``:
    ``f_bavail × f_frsize``). The one free-space reader: the tests patch it."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _hook_saved(folder, rank):
    """Called on every rank between the save and the load, with the checkpoint's folder:
    where the tests corrupt a shard (monkeypatched)."""


def _read_marker(path):
    """The text of the shared folder's marker file as this rank reads it (the tests patch
    it to play a rank that does not see the folder); None when it is not there."""
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


# --- the folder, the space, the page cache: shared with smallfiles ----------------------


def agree(world, problem):
    """Every rank's ``problem`` (None, or ``(exception class, message)``) over the world;
    raises the first rank's on every rank, so that all ranks fail at the same point and
    none waits for the others in a collective that never comes."""
    problems = [problem]
    if world.size > 1:
        problems = [None] * world.size
        dist.all_gather_object(problems, problem)
    for rank, found in enumerate(problems):
        if found is not None:
            cls, message = found
            where = f" (rank {rank})" if world.size > 1 and cls is not NoSpace else ""
            raise cls(message + where)


def _check_folder(folder):
    """None, or why ``folder`` cannot hold the test's files (missing, not a folder, not
    writable)."""
    if not os.path.exists(folder):
        return f"--folder {folder}: no such folder"
    if not os.path.isdir(folder):
        return f"--folder {folder}: not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"--folder {folder}: not writable by this user"
    return None


def shared_workdir(world, folder, kind, need):
    """Make the test's fresh subfolder of ``folder``, seen by every rank; returns its path.

    Every rank checks ``folder``; rank 0 checks that its filesystem has ``need`` bytes
    free (:func:`free_bytes`), creates ``milarun-<kind>-<unique>`` and writes a marker
    there; every rank reads the marker back. Each failure is agreed over the world
    (:func:`agree`).

    Raises:
        StorageError: ``folder`` missing, not a folder, not writable or not shared.
        NoSpace: fewer than ``need`` bytes free.
    """
    agree(world, (StorageError, p) if (p := _check_folder(folder)) else None)
    name, problem = None, None
    if world.rank == 0:
        free = free_bytes(folder)
        if free < need:
            problem = (
                NoSpace,
                f"{folder} has {free} B free; {kind} needs {need} B "
                f"({need / 1e9:.3f} GB, margin included): nothing was written",
            )
        else:
            name = f"milarun-{kind}-{uuid.uuid4().hex[:16]}"
            token = uuid.uuid4().hex
            try:
                os.mkdir(os.path.join(folder, name))
                with open(os.path.join(folder, name, ".milarun-marker"), "w") as f:
                    f.write(token)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
                cls = NoSpace if exc.errno == errno.ENOSPC else StorageError
                problem = (cls, f"--folder {folder}: cannot write in it ({exc.strerror})")
            name = (name, token)
    agree(world, problem)
    shared = [name]
    if world.size > 1:
        dist.broadcast_object_list(shared, src=0)
    (name, token) = shared[0]
    path = os.path.join(folder, name)
    seen = _read_marker(os.path.join(path, ".milarun-marker"))
    problem = None
    if seen != token:
        problem = (
            StorageError,
            f"--folder {folder} is not shared: node {node_name(None)} does not see the "
            f"marker rank 0 wrote in {path}",
        )
    try:
        agree(world, problem)
    except StorageError:
        if world.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def remove_workdir(world, path, ok):
    """Remove the test's subfolder ``path`` (after a barrier when every rank got there);
    returns whether it is gone (rank 0; True elsewhere)."""
    if path is None:
        return True
    if ok and world.size > 1:
        dist.barrier()
    if world.rank == 0 or not ok:
        shutil.rmtree(path, ignore_errors=True)
    return world.rank != 0 or not os.path.exists(path)


def drop_file_pages(path):
    """``fsync`` then ``posix_fadvise(POSIX_FADV_DONTNEED)`` on ``path``: the kernel drops
    its pages, clean once synced, from the page cache. Returns whether both calls
    succeeded (not whether the pages went: :func:`resident_fraction` says)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.fsync(fd)  # dirty pages are not dropped: write them first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def drop_node_caches(level):
    """Write ``level`` (1: the page cache; 3: also dentries and inodes) to
    ``/proc/sys/vm/drop_caches`` after ``sync``: the whole node's caches, as root only.
    Returns whether it worked."""
    if os.geteuid() != 0:
        return False
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(str(level))
        return True
    except OSError:
        return False


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _LIBC = libc
    return _LIBC


def resident_fraction(path):
    """The share of ``path``'s pages in the page cache, from 0 to 1 (``mincore(2)`` on a
    read-only shared mapping of the file, which reads nothing); None where it cannot be
    told (an empty file, no libc, a filesystem that cannot be mapped)."""
    try:
        libc = _libc()
        size = os.path.getsize(path)
        fd = os.open(path, os.O_RDONLY)
    except (OSError, AttributeError):
        return None
    try:
        if size == 0:
            return None
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return sum(b & 1 for b in vec) / pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def available_memory():
    """Bytes of host memory available to new allocations without swapping: ``MemAvailable``
    of ``/proc/meminfo`` (free memory and the cache the kernel can reclaim), else the free
    pages (``sysconf``)."""
    for line in (read_text("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def max_known(values):
    """The largest of ``values`` that is not None; None when none is known."""
    return max((v for v in values if v is not None), default=None)


def spread(ranks, amount, seconds):
    """The rates of one round over its ranks and nodes, where some rank or node is slow.

    Args:
        ranks: every rank's figures of the round (dicts with ``node``, ``amount`` and
            ``seconds`` keys).
        amount: the key of what a rank moved (bytes, files).
        seconds: the key of the time it took (s).

    Returns:
        ``{"per_rank", "rank_min", "per_node", "node_min"}``: the mean and the lowest rank
        rate (amount / seconds), and the mean and the lowest node rate (the node's amount
        over its slowest rank's time, as a node is done when its last rank is); a pair is
        left out where some time is 0 (no rate).
    """
    nodes = {}
    for f in ranks:
        nodes.setdefault(f["node"], []).append(f)
    out = {}
    for level, groups in (("rank", [[f] for f in ranks]), ("node", list(nodes.values()))):
        rates = [
            sum(f[amount] for f in g) / s if (s := max(f[seconds] for f in g)) > 0 else None
            for g in groups
        ]
        if None not in rates:
            out[f"per_{level}"] = sum(rates) / len(rates)
            out[f"{level}_min"] = min(rates)
    return out


def dropped(m):
    """``page_cache_dropped`` from the metrics ``m``: True or False, or ``"unknown"`` where
    no file's residency could be read (no ``page_cache_resident_fraction``)."""
    fraction = m.get("page_cache_resident_fraction")
    return "unknown" if fraction is None else fraction < DROPPED_BELOW


def median(values):
    """The median of ``values`` (None when empty or any is None)."""
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    return statistics.median(values)


# --- the state ---------------------------------------------------------------------------


def state_params(shape, state_mib, world_size):
    """Parameters of one rank's shard: ``--state-mib`` MiB over :data:`BYTES_PER_PARAM`,
    else the shape's count over the ranks (rounded up: the last rank is not short)."""
    if state_mib:
        return max(1, state_mib * 2**20 // BYTES_PER_PARAM)
    return -(-SHAPES[shape] // world_size)


def build_state(params, rank, seed):
    """One rank's state of ``params`` parameters (module docstring): ``{name: tensor}``, the
    bytes random from ``(seed, rank, tensor index)``."""
    state = {}
    index = 0
    for start in range(0, params, CHUNK_PARAMS):
        n = min(CHUNK_PARAMS, params - start)
        chunk = start // CHUNK_PARAMS
        tensors = {
            f"rank{rank}.model.{chunk}": torch.empty(n, dtype=torch.bfloat16),
            f"rank{rank}.optim.{chunk}.master": torch.empty(n, dtype=torch.float32),
            f"rank{rank}.optim.{chunk}.exp_avg": torch.empty(n, dtype=torch.float32),
            f"rank{rank}.optim.{chunk}.exp_avg_sq": torch.empty(n, dtype=torch.float32),
        }
        for name, t in tensors.items():
            gen = torch.Generator().manual_seed(_seed_of(seed, rank, index))
            # random bytes (any bit pattern, NaN included: compared as bytes, never as numbers),
            # 8 at a time (about 1 GB/s a core, 7 times a byte at a time), the rest one by one
            raw = t.view(torch.uint8)
            head = raw.numel() // 8 * 8
            raw[:head].view(torch.int64).random_(generator=gen)
            raw[head:].random_(0, 256, generator=gen)
            state[name] = t
            index += 1
    return state


def _seed_of(*parts):
    """A 63-bit seed from ``parts``, the same on every Python (sha256 of their text)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def tensor_digest(t):
    """The sha256 (hex) of a contiguous CPU tensor's bytes."""
    return hashlib.sha256(t.view(torch.uint8).numpy().data).hexdigest()


def file_digest(path, block=16 * 2**20):
    """The sha256 (hex) of the file ``path``, read in blocks of ``block`` bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def _shard_files(folder, names):
    """``{name: shard file}`` of the tensors ``names`` from the checkpoint's metadata."""
    meta = dcp.FileSystemReader(folder).read_metadata()
    wanted = set(names)
    return {
        index.fqn: info.relative_path
        for index, info in meta.storage_data.items()
        if index.fqn in wanted
    }


def _no_space(exc):
    """Whether ``exc`` or an exception it holds (DCP's ``CheckpointException`` keeps each
    rank's) ran out of space (``ENOSPC``)."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(e):
            return True
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [f for f in failures.values() if isinstance(f, BaseException)]
    return False


# --- the run -----------------------------------------------------------------------------


@tooled
def train(exp):
    # Parameter count of the state: tiny (2**20), 1b, 8b or 70b (Llama 3's), divided over
    # the ranks at 14 bytes a parameter (bf16 weights, fp32 master weights and Adam moments)
    shape: Option = default("tiny")
    # A rank's state in MiB instead of --shape (0: use --shape; 1 to 4194304)
    state_mib: Option & int = default(0)
    # Folder of the shared filesystem the checkpoint is written under, in a fresh
    # subfolder removed at the end (default: the dataroot)
    folder: Option = default("")
    # Rounds of save then load (1 to 1000); the figures are their medians
    repeat: Option & int = default(1)
    # Drop the node's page cache through /proc/sys/vm/drop_caches before each load (root
    # only; else, and by default, posix_fadvise DONTNEED on each written file)
    drop_caches: Option & bool = default(False)

    if shape not in SHAPES:
        raise ValueError(f"--shape must be one of {', '.join(SHAPES)}, not {shape!r}")
    if not 0 <= state_mib <= MAX_STATE_MIB:
        raise ValueError(f"--state-mib must be between 0 and {MAX_STATE_MIB}, not {state_mib}")
    if not 1 <= repeat <= 1000:
        raise ValueError(f"--repeat must be between 1 and 1000, not {repeat}")
    folder = folder or exp.dataroot
    if not folder:
        raise ValueError("--folder is not given and there is no dataroot to default to")
    folder = os.path.abspath(folder)
    device = init_torch(exp)
    # the state is in host memory and DCP's collectives carry Python objects: gloo
    with process_group(exp, device, "gloo") as world:
        run_checkpoint(exp, world, shape, state_mib, folder, repeat, drop_caches)


def run_checkpoint(exp, world, shape, state_mib, folder, repeat, drop_caches):
    """The rounds of the module docstring, in ``folder``'s fresh subfolder, removed at the
    end whatever happens."""
    m = exp.metrics
    params = state_params(shape, state_mib, world.size)
    state_bytes = params * BYTES_PER_PARAM
    m.update(
        {
            "shape": "custom" if state_mib else shape,
            "params": params * world.size,
            "bytes_per_param": BYTES_PER_PARAM,
            "state_bytes_per_rank": state_bytes,
            "repeat": repeat,
            "folder": folder,
        }
    )
    # host memory for the node's ranks' states, before any is built
    avail = available_memory()
    node_state = state_bytes * max(1, world.local_size)
    agree(
        world,
        None
        if node_state < avail
        else (
            StorageError,
            f"the node's ranks' states ({node_state} B) do not fit in the host's available "
            f"memory ({avail} B): use more ranks or a smaller --shape / --state-mib",
        ),
    )
    chunks = -(-params // CHUNK_PARAMS) * 4
    need = state_bytes * world.size + chunks * world.size * 4096 + SPACE_MARGIN
    m["space_needed_bytes"] = need
    work = shared_workdir(world, folder, "checkpoint", need)
    ok = False
    try:
        state = build_state(params, world.rank, exp.options["seed"])
        digests = {name: tensor_digest(t) for name, t in state.items()}
        rounds = []
        phases = Phases(exp, world)
        for r in range(repeat):
            ckpt = os.path.join(work, f"round{r}")
            _round(exp, world, state, digests, ckpt, drop_caches, phases, rounds)
            if world.size > 1:
                dist.barrier()
            if world.rank == 0:
                shutil.rmtree(ckpt, ignore_errors=True)
        phases.close()
        ok = True
    except BaseException as exc:
        if not isinstance(exc, (NoSpace, CheckpointMismatch)) and _no_space(exc):
            raise NoSpace(
                f"{folder} ran out of space during the test ({exc}); figures so far in metrics"
            ) from exc
        raise
    finally:
        gone = remove_workdir(world, work, ok)
        if world.rank == 0:
            m["cleaned_up"] = gone


def _round(exp, world, state, digests, ckpt, drop_caches, phases, rounds):
    """One save and load of ``state`` in ``ckpt``: its figures (every rank's, gathered)
    appended to ``rounds`` and summarised into the metrics, then the state read back
    checked (:class:`CheckpointMismatch`)."""
    names = list(state)
    # save: every rank from one barrier
    if world.size > 1:
        dist.barrier()
    phases.start()
    t0 = time.perf_counter()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(ckpt, sync_files=True))
    save_s = time.perf_counter() - t0
    shards = _shard_files(ckpt, names)
    mine = sorted(set(shards.values()))
    written = sum(os.path.getsize(os.path.join(ckpt, f)) for f in mine)
    file_digests = {f: file_digest(os.path.join(ckpt, f)) for f in mine}
    total_written = _sum(world, written)
    phases.done(total_written)
    # the page cache: every rank drops its own files' pages (rank 0 the metadata's too)
    own = [os.path.join(ckpt, f) for f in mine]
    if world.rank == 0:
        own.append(os.path.join(ckpt, ".metadata"))
    method, refused = drop_pages(world, own, drop_caches, 1)
    if refused:
        exp.metrics["drop_caches_refused"] = True
    resident = max_known(resident_fraction(p) for p in own)
    _hook_saved(ckpt, world.rank)
    # load into the same tensors, zeroed: what they hold after is what was read
    for t in state.values():
        t.view(torch.uint8).zero_()
    if world.size > 1:
        dist.barrier()
    phases.start()
    t0 = time.perf_counter()
    load_error = None
    try:
        dcp.load(state, storage_reader=dcp.FileSystemReader(ckpt))
    except Exception as exc:  # a shard that cannot be parsed is a mismatch too
        load_error = exc
    load_s = time.perf_counter() - t0
    phases.done(total_written)
    figures = {
        "node": node_name(exp.result.get("node")),
        "written": written,
        "save_s": save_s,
        "load_s": load_s,
        "method": method,
        "resident": resident,
    }
    gathered = [figures]
    if world.size > 1:
        gathered = [None] * world.size
        dist.all_gather_object(gathered, figures)
    rounds.append(gathered)
    _summarise(exp.metrics, rounds)  # before the check: a FAIL keeps the figures so far
    # the check: tensors against their digests before the save, files against theirs after
    bad = [] if load_error else [n for n in names if tensor_digest(state[n]) != digests[n]]
    changed = [f for f in mine if file_digest(os.path.join(ckpt, f)) != file_digests[f]]
    problem = None
    if load_error or bad or changed:
        shown = ", ".join(f"{n} in {shards.get(n, '?')}" for n in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        parts = []
        if load_error:
            parts.append(f"the load failed ({type(load_error).__name__}: {load_error})")
        if bad:
            parts.append(f"{len(bad)} tensor(s) read back different: {shown}{more}")
        if changed:
            parts.append(f"shard file(s) changed since the save: {', '.join(changed)}")
        problem = (CheckpointMismatch, f"checkpoint {ckpt}: " + "; ".join(parts))
    agree(world, problem)


class Phases:
    """The rate logger's samples, one per timed phase (a save, a load, a listing…): the
    window opens at :meth:`start` and closes at :meth:`done` with the phase's items, so
    the untimed work between phases (hashes, page-cache drops) is in no sample."""

    def __init__(self, exp, world):
        self.exp = exp
        self.steps = iteration_wrapper(exp)
        exp.rate.max_count = None  # the phases end the run
        exp.rate.warmup = 0  # every phase is a measure (the figures are metrics)
        if world.rank != 0 and exp.rate.tracer is None:
            exp.rate.follow()
        self.step = next(self.steps)

    def start(self):
        self.exp.rate.restart()

    def done(self, items):
        self.step.set_count(max(1, int(items)))
        self.step = next(self.steps)
        self.exp.rate.cut()

    def close(self):
        self.steps.close()


def _sum(world, value):
    t = torch.tensor([value], dtype=torch.int64)
    if world.size > 1:
        dist.all_reduce(t)
    return int(t.item())


def drop_pages(world, paths, drop_caches, level):
    """Drop the pages of ``paths`` (this rank's files) from the page cache: with
    ``drop_caches``, ``level`` written to ``/proc/sys/vm/drop_caches`` by each node's first
    rank (:func:`drop_node_caches`), else or when that fails on any node, ``fsync`` and
    ``posix_fadvise`` on each file (:func:`drop_file_pages`). Returns ``(method, refused)``:
    the method that ran (``drop_caches``, ``fadvise`` or ``none`` when no call succeeded)
    and whether ``drop_caches`` was asked for and could not be used."""
    if drop_caches:
        done = drop_node_caches(level) if world.local_rank == 0 else True
        flags = [done]
        if world.size > 1:
            flags = [None] * world.size
            dist.all_gather_object(flags, done)
        if all(flags):
            return "drop_caches", False
    ok = all([drop_file_pages(p) for p in paths]) if paths else False
    return ("fadvise" if ok else "none"), drop_caches


def _summarise(m, rounds):
    """Into the metrics ``m``, the figures of ``rounds`` (each: every rank's figures of one
    round): the medians over the rounds of the module docstring's figures; the page-cache
    method and ``nodes`` of the last round."""
    per = []
    for ranks in rounds:
        total = sum(f["written"] for f in ranks)
        save = max(f["save_s"] for f in ranks)
        load = max(f["load_s"] for f in ranks)
        out = {"save_s": save, "load_s": load}
        for kind, key in (("write", "save_s"), ("read", "load_s")):
            slowest = out[key]  # the slowest rank's time
            out[f"{kind}_gbps_aggregate"] = total / slowest / 1e9 if slowest > 0 else None
            for name, rate in spread(ranks, "written", key).items():
                out[f"{kind}_gbps_{name}"] = rate / 1e9
        out["bytes_per_rank"] = max(f["written"] for f in ranks)
        out["checkpoint_bytes"] = total
        out["nodes"] = len({f["node"] for f in ranks})
        methods = {f["method"] for f in ranks}
        out["page_cache_method"] = methods.pop() if len(methods) == 1 else "mixed"
        out["page_cache_resident_fraction"] = max_known(f["resident"] for f in ranks)
        per.append(out)
    keys = per[-1].keys()
    for key in keys:
        values = [p.get(key) for p in per]
        if isinstance(values[-1], str) or key in ("nodes", "bytes_per_rank", "checkpoint_bytes"):
            m[key] = values[-1]
        else:
            value = median(values)
            if value is not None:
                m[key] = value
    m["page_cache_dropped"] = dropped(m)
