"""Share independent tasks between this process and forked copies of it (Linux).

The report reads 10,000 result records into memory and then does work per test
that reads them and returns little (a test's throughput plot: an SVG string).
Worker processes made with ``fork`` see those records without a copy (the
kernel shares the pages until one is written), so only the small results travel
back; a pool of fresh processes would have to be sent the records, which costs
more than the work (unpickling 10,000 records takes as long as parsing them).

:class:`Shared` forks its workers at once; they and the parent take task
numbers from one queue (a pipe holding one 4-byte number per task: a read of 4
bytes from a pipe is never split, so no task is taken twice and no lock is
held that a dying worker could keep), so a parent busy with something else
meanwhile (the summary) leaves more tasks to the workers, and one that is free
takes its share. A worker sends its results back when the queue is empty, in
``marshal`` format (plain values only). A task that a worker took but did not
send back (it raised, was killed, ran out of memory) is done again by the
parent, which then raises what the task raises: the outcome never depends on
the workers, only the time does.

No worker is forked when this process has other threads (a lock one of them
holds would stay held forever in the copy), when it may use one CPU only, or
for fewer than two tasks: the parent then does every task itself.
"""

import fcntl
import gc
import marshal
import os
import signal
import struct
import sys
import threading

from .supervise import set_parent_death_signal

_TOKEN = struct.Struct("=I")
#: Linux ``fcntl`` command that sets a pipe's capacity (bytes).
_F_SETPIPE_SZ = 1031
#: The most tasks a queue holds (4 bytes each in a pipe of at most 1 MiB, the
#: unprivileged limit of ``/proc/sys/fs/pipe-max-size``).
MAX_TASKS = 2**18


def usable_cpus():
    """The CPUs this process may run on (its affinity mask: a cgroup's cpuset or
    ``taskset`` narrows it), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _reap(pid):
    """Wait for worker ``pid`` to end (already reaped by someone else: nothing to do)."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class Shared:
    """Tasks ``0 … count-1``, each ``run(i)``, shared with forked workers.

    Args:
        count: the number of tasks.
        run: the task: ``run(i)`` returns a value ``marshal`` can write (None,
            bool, int, float, str, bytes, and tuples, lists, dicts, sets of them).
            It must not depend on which process runs it, nor on the order.
        workers: processes in all, the parent included (default: the usable
            CPUs, :func:`usable_cpus`); 1 forks nothing.

    Use as a context manager: leaving the block early (an exception, Ctrl-C) kills
    and reaps the workers. :meth:`results` does the parent's share and returns
    every task's value, in task order.
    """

    def __init__(self, count, run, workers=None):
        self.count, self.run = count, run
        workers = usable_cpus() if workers is None else workers
        workers = min(workers, count)
        self.children = []  # (pid, read end of its results pipe)
        self.queue = None
        self.redone = 0
        if workers < 2 or count > MAX_TASKS or threading.active_count() > 1:
            return
        sys.stdout.flush()  # or the workers' copies would write it again
        sys.stderr.flush()
        read, write = os.pipe()
        tokens = b"".join(_TOKEN.pack(i) for i in range(count))
        try:
            if len(tokens) > 65536:
                fcntl.fcntl(write, _F_SETPIPE_SZ, len(tokens))
            # never wait for room: this process is the queue's only reader, and a pipe
            # may hold less than 64 KiB (a user past pipe-user-pages-soft gets one page)
            os.set_blocking(write, False)
            if os.write(write, tokens) != len(tokens):
                raise BlockingIOError("the queue does not fit in its pipe")
        except OSError:
            os.close(read)
            os.close(write)
            return
        os.close(write)  # the queue's end: an empty pipe without a writer reads b""
        self.queue = read
        # the collector would write into every object's header and so copy every page
        gc.freeze()
        parent = os.getpid()
        try:
            self._fork(workers - 1, parent)
        except BaseException:  # e.g. Ctrl-C between two forks: no worker outlives it
            self.__exit__()
            raise
        finally:
            gc.unfreeze()

    def _fork(self, workers, parent):
        """Fork ``workers`` workers (fewer when ``fork`` fails)."""
        for _ in range(workers):
            out, into = os.pipe()
            try:
                pid = os.fork()
            except OSError:
                os.close(out)
                os.close(into)
                break
            if pid == 0:  # the worker
                os.close(out)
                self._work(into, parent)  # never returns
            os.close(into)
            self.children.append((pid, out))

    def _take(self):
        """The next task's number, or None when the queue is empty."""
        if self.queue is None:
            return None
        raw = os.read(self.queue, _TOKEN.size)
        return _TOKEN.unpack(raw)[0] if len(raw) == _TOKEN.size else None

    def _work(self, into, parent):
        """A worker's life: take tasks until none is left, send the values, exit."""
        code = 1
        try:
            # a parent killed outright takes its workers with it
            set_parent_death_signal(signal.SIGKILL, launcher_pid=parent, parent_at_start=parent)
            gc.disable()
            # Ctrl-C, a stop or a hang-up: end, say nothing (the parent's handlers, such
            # as the launcher's stop request, are not the worker's to run)
            for sig in (
                signal.SIGINT,
                signal.SIGTERM,
                signal.SIGHUP,
                signal.SIGCHLD,
                signal.SIGUSR1,
                signal.SIGUSR2,
                signal.SIGALRM,
            ):
                if signal.getsignal(sig) not in (signal.SIG_IGN, None):
                    signal.signal(sig, signal.SIG_DFL)
            done = {}
            while True:
                i = self._take()
                if i is None:
                    break
                try:
                    done[i] = self.run(i)
                except BaseException:  # the parent does it again and raises
                    break
            data = marshal.dumps(done)
            with open(into, "wb", closefd=True) as f:
                f.write(data)
            code = 0
        finally:
            os._exit(code)  # no atexit, no flush of the parent's buffers

    def results(self):
        """Do tasks until the queue is empty, gather the workers' values, do again
        any task that no one finished, and return ``[run(0), …, run(count-1)]``.

        Raises:
            whatever a task raises (in the parent).
        """
        done, forked = {}, bool(self.children)
        while (i := self._take()) is not None:
            try:
                done[i] = self.run(i)
            except Exception:  # raised again below, in task order (the first that
                break  # raises, whichever process took it first)
        for pid, out in self.children:
            with open(out, "rb", closefd=True) as f:
                data = f.read()
            try:
                got = marshal.loads(data) if data else {}
            except (EOFError, ValueError, TypeError):
                got = {}  # a worker that died while writing
            if isinstance(got, dict):
                done.update(
                    (k, v) for k, v in got.items() if isinstance(k, int) and 0 <= k < self.count
                )
            _reap(pid)
        self.children = []
        self._close()  # tasks still queued (the parent stopped at an error) are redone
        #: tasks this process did again (a worker took them and did not send them back)
        self.redone = sum(1 for i in range(self.count) if i not in done) if forked else 0
        return [done[i] if i in done else self.run(i) for i in range(self.count)]

    def _close(self):
        if self.queue is not None:
            os.close(self.queue)
            self.queue = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """Kill and reap the workers not gathered by :meth:`results`."""
        for pid, out in self.children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(out)
            _reap(pid)
        self.children = []
        self._close()
        return False
