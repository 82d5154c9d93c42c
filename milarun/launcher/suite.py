"""The suite of ``milarun jobs``: load the profile, plan it, check that everything is ready,
open (or resume) the session, start the barrier server, run the waves and tally them.

:func:`run_jobs` is the whole of ``milarun jobs`` after its options are parsed
(``milarun.cli.jobs`` parses them and calls it); its exit code is the command's.
"""

import contextlib
import ipaddress
import json
import signal
import socket
from pathlib import Path

from ..errors import SetupError, say
from ..formats.barrier import BARRIER_TIMEOUT_S, BarrierServer, join_address
from ..host import devices as devices_mod
from ..host import prescreen as prescreen_mod
from ..host.net import free_port
from ..plan import nodes as nodes_mod
from ..plan.launches import RDZV_PORT, plan_suite
from ..plan.types import JOIN_TIMEOUT_S
from ..profile.language import load_profile
from . import dryrun, identities, session
from .bounds import check_bounds
from .chain import SessionChain
from .child import ensure_descriptors
from .dryrun import resolve_dataroot
from .preflight import check_ready
from .progress import SuiteProgress
from .session import default_outdir, new_session_id
from .stopping import Interrupted, StopRequest, stop_on_signals
from .waves import SuiteAborted, run_suite, tally


def run_jobs(
    profile,
    extra_args,
    dataroot=None,
    out=None,
    resume=None,
    names=None,
    repeat=1,
    no_cgexec=False,
    cpu_slots=None,
    timeout=None,
    dry_run=False,
    verbose=False,
    system=None,
    single_node=False,
    rdzv_port=None,
    join_timeout=None,
    environ=None,
    barrier_timeout=None,
    select=None,
    exclude=None,
    prescreen_fatal=None,
):
    """``milarun jobs``, its options parsed (one argument each, as ``milarun.cli.jobs``
    names them; ``extra_args``: the arguments after ``--``): validate everything, then
    plan and run the suite, or show it (``dry_run``); returns the exit code.

    0: every launch passed; 1: some failed, or the suite stopped on a full
    disk; 128 + N: stopped by signal N (SIGINT, SIGTERM, SIGHUP).

    Before the first launch every node's host prescreen (in its identity,
    :func:`milarun.launcher.identities.show_prescreen`) prints the findings that failed or
    are unknown; ``prescreen_fatal`` (``--prescreen-fatal``: comma-separated finding names)
    stops the suite when one of those is not ok on some node. A dry run prints every
    finding of this host (:func:`milarun.launcher.dryrun.show_prescreen`).

    Raises:
        MilarunError: bad profile, options, dataroot or results folder, or a
            ``--prescreen-fatal`` finding not ok (nothing is launched).
    """
    fatal = prescreen_names(prescreen_fatal)
    jobs_ = load_profile(profile, names, select, exclude)
    if select or exclude:  # --resume compares the tests chosen, whatever chose them
        names = [j.name for j in jobs_]
    check_bounds(repeat, cpu_slots, timeout, join_timeout, barrier_timeout)
    if resume is not None and out is not None and Path(out).resolve() != Path(resume).resolve():
        raise SetupError(f"-o {out} and --resume {resume} name two folders; give only --resume")
    try:
        devs = devices_mod.discover(cpu_slots)
    except ValueError as exc:
        raise SetupError(str(exc))
    cluster = nodes_mod.discover(devs, system=system, single_node=single_node, environ=environ)
    if rdzv_port is not None and not 1 <= rdzv_port <= 65535:
        raise SetupError(f"--rdzv-port must be a port number from 1 to 65535, not {rdzv_port}")
    if rdzv_port is None:
        # A port of its own: two sessions on one main node never share a rendezvous store.
        rdzv_port = free_port(default=RDZV_PORT)
    plan_opts = dict(
        extra_args=extra_args,
        use_cgexec=not no_cgexec,
        timeout=timeout,
        rdzv_port=rdzv_port,
        join_timeout=join_timeout or JOIN_TIMEOUT_S,
    )
    for job in jobs_:
        for note in job.kind.notes(job, cluster):
            say(f"milarun: {job.full_name}: {note}")
    outdir = resume or out or default_outdir()
    barrier_timeout = barrier_timeout or BARRIER_TIMEOUT_S
    if dry_run:
        # the real run's checks, all of them, without writing; then the same exit status
        sid, when = new_session_id()
        probe = plan_suite(jobs_, cluster, repeat, outdir or ".", dataroot=dataroot, **plan_opts)
        errors, shown_root, shown_out = dryrun.checks(
            probe, dataroot, outdir, resume is not None, use_cgexec=not no_cgexec
        )
        # the real run's server listens on a port the system picks when it starts
        where = _barrier_host(cluster)
        barrier = where and {
            "address": join_address(where[1], "PORT"),
            "timeout": barrier_timeout,
            "secret": "SECRET",
        }
        waves = plan_suite(
            jobs_,
            cluster,
            repeat,
            shown_out,
            dataroot=shown_root,
            session=when,
            barrier=barrier,
            **plan_opts,
        )
        dryrun.show(jobs_, waves, devs, cluster, repeat, sid, shown_root, shown_out)
        errors += dryrun.show_prescreen(cluster, fatal)
        return dryrun.report(errors, cluster)
    dataroot = resolve_dataroot(dataroot)
    if outdir is None:
        raise SetupError("no results directory: pass -o OUTDIR or set $MILARUN_OUTROOT")
    outdir = str(Path(outdir).resolve())
    if resume is not None and not Path(outdir).is_dir():
        raise SetupError("--resume: no such results directory", path=outdir)
    # Plan once to check cgroups and programs before touching the folder.
    check_ready(
        plan_suite(jobs_, cluster, repeat, outdir, dataroot=dataroot, **plan_opts),
        use_cgexec=not no_cgexec,
    )
    session.check_outdir(outdir)
    nodes_mod.check_shared_outdir(cluster, outdir)
    current = session.invocation(
        profile,
        jobs_[0].suite,
        names,
        repeat,
        cpu_slots,
        no_cgexec,
        timeout,
        extra_args,
        dataroot,
        devs,
        nodes=[n.name for n in cluster.nodes] if cluster.multi else None,
    )
    identity = identities.collect(cluster)  # every node's hardware, for the session file
    # judged before anything is written; its lines are shown once the folder is this
    # session's, so a refused folder is still one line
    shown: list[str] = []
    failed = identities.show_prescreen(identity, fatal, log=shown.append)
    if failed:
        for line in shown:
            say(line)
        raise SetupError(
            f"--prescreen-fatal: {len(failed)} finding(s) not ok, nothing launched: "
            + "; ".join(failed[:5])
            + (f"; and {len(failed) - 5} more" if len(failed) > 5 else "")
        )
    with session.OutdirLock(outdir), start_barrier(cluster) as server:
        # read (and check) the manifest before the session file changes: a broken chain
        # stops --resume with nothing written
        chain = SessionChain(outdir)
        sid, when, done, foreign, removed = session.open_session(
            outdir, current, resume is not None, identity=identity
        )
        barrier = server and {
            "address": server.address,
            "timeout": barrier_timeout,
            "secret": server.secret,
        }
        waves = plan_suite(
            jobs_,
            cluster,
            repeat,
            outdir,
            dataroot=dataroot,
            session=when,
            barrier=barrier,
            **plan_opts,
        )
        waves, skipped, ignored = skip_done(waves, done, foreign)
        # every child of a wave holds descriptors in this process at once
        ensure_descriptors(max((len(wave) for wave in waves), default=0))
        chain.start(sid, profile, waves, skipped, resume is not None)
        for line in shown:  # the host prescreen, before the first launch
            say(line)
        return _run(
            waves,
            outdir,
            dataroot,
            jobs_,
            devs,
            sid,
            skipped,
            removed,
            verbose,
            cluster,
            barrier=server,
            ignored=ignored,
            chain=chain,
        )


def prescreen_names(text):
    """The finding names of ``--prescreen-fatal`` (``"a,b"``, or a list of such strings;
    None: none), in order, without repeats.

    Raises:
        SetupError: a name that is not one of :data:`milarun.host.prescreen.NAMES`.
    """
    if not text:
        return []
    parts = [text] if isinstance(text, str) else list(text)
    out = []
    for name in (n.strip() for part in parts for n in str(part).split(",")):
        if not name:
            continue
        if name not in prescreen_mod.NAMES:
            raise SetupError(
                f"--prescreen-fatal: unknown finding {name!r} (one of "
                f"{', '.join(prescreen_mod.NAMES)})"
            )
        if name not in out:
            out.append(name)
    return out


def _canonical(value):
    """``value`` as canonical JSON (sorted keys, no spaces), or None when it is not JSON."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


def skip_done(waves, done, foreign):
    """Leave out of ``waves`` the launches that already passed (``--resume``).

    A launch passed when one of this folder's sessions left a successful record
    for its (name, run, device) whose ``job`` is the definition the plan has for
    it (same canonical JSON); a record of another definition does not count and
    the launch reruns.

    Args:
        done, foreign: as :func:`milarun.launcher.session.successful_keys` gives them.

    Returns:
        ``(waves, skipped, ignored)``: the waves left, the set of launch keys
        skipped, and ``(path, why)`` of every successful record not counted.
    """
    ignored = list(foreign)
    skipped = set()
    for lch in (lch for wave in waves for lch in wave):
        records = done.get(lch.key, [])
        want = _canonical(lch.job.definition)
        if any(_canonical(job) == want for _, job in records):
            skipped.add(lch.key)
        else:
            ignored += [(path, "its job definition is not the profile's") for path, _ in records]
    waves = [w for w in ([lch for lch in wave if lch.key not in skipped] for wave in waves) if w]
    return waves, skipped, ignored


def _ignored_line(ignored, outdir, first=3):
    """One line: how many successful records ``--resume`` did not count, and the first few."""
    names = []
    for path, why in ignored[:first]:
        try:
            name = str(Path(path).relative_to(outdir))
        except ValueError:
            name = str(path)
        names.append(f"{name if name.isprintable() else ascii(name)} ({why})")
    more = f" and {len(ignored) - first} more" if len(ignored) > first else ""
    return (
        f"milarun: --resume: {len(ignored)} successful record(s) not counted as passed "
        f"(their launches run again): {', '.join(names)}{more}"
    )


def _barrier_host(cluster):
    """``(host to listen on, host the children connect to)`` of the start barrier,
    or None when there can be none.

    One local node: ``127.0.0.1``. Several nodes (or Slurm, ssh), reached at the
    main node's address as the rendezvous is, which needs ``milarun jobs`` to run
    on the main node (as in a Slurm batch step; else None): loopback when every
    node is this host's loopback (``127.0.0.1``, ``::1``, ``localhost``); the main
    node's address itself when it is an IP address; every interface of its
    family (``0.0.0.0``, or ``::`` for a name with IPv6 addresses only) for a name,
    which other nodes may resolve to another of this host's addresses.
    """
    if cluster.kind == "local" and not cluster.multi:
        return "127.0.0.1", "127.0.0.1"
    address = cluster.main.address or cluster.main.name
    if not _is_this_host(address):
        return None
    resolved = _resolve(address)
    nodes = [_resolve(n.address or n.name) for n in cluster.nodes]
    if all(ips and all(ip.is_loopback for ip in ips) for ips in nodes):
        loop = [ip for ip in resolved if ip.version == 4] or resolved
        return str(loop[0]), address
    literal = _ip(address)
    if literal is not None:  # as written (an IPv6 scope kept), an IPv4-mapped one as IPv4
        return (str(literal) if literal.version == 4 else address.strip("[]")), address
    return ("::" if all(ip.version == 6 for ip in resolved) else "0.0.0.0"), address


def _ip(text):
    """``text`` as an ``ipaddress`` address (an IPv4-mapped IPv6 one as IPv4), or None
    when it is a name."""
    try:
        ip = ipaddress.ip_address(str(text).strip("[]").split("%")[0])
    except ValueError:
        return None
    return getattr(ip, "ipv4_mapped", None) or ip


def _resolve(address):
    """The IP addresses (``ipaddress`` objects, IPv4-mapped ones as IPv4) ``address``
    resolves to, IPv4 and IPv6 alike; [] when it does not resolve."""
    try:
        infos = socket.getaddrinfo(
            str(address).strip("[]"), None, socket.AF_UNSPEC, socket.SOCK_STREAM
        )
    except (OSError, UnicodeError, ValueError):
        return []
    out = []
    for *_, sockaddr in infos:
        ip = _ip(sockaddr[0])
        if ip is not None and ip not in out:
            out.append(ip)
    return out


def _is_this_host(address):
    """True when ``address`` (a name, or an IPv4 or IPv6 address) resolves to an address
    of this host: a loopback one (``127.0.0.0/8``, ``::1``), or one a socket can be
    bound to (only this host's can)."""
    for ip in _resolve(address):
        if ip.is_loopback:
            return True
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((str(ip), 0))
            return True
        except OSError:
            continue
    return False


def start_barrier(cluster):
    """The :class:`milarun.formats.barrier.BarrierServer` of a session, as a context manager
    that starts it, and at its end says how many strangers (connections without the
    session's secret) it refused; a null context (None) when :func:`_barrier_host`
    gives none, after a warning that concurrent tests start unsynchronized.

    Raises:
        SetupError: its socket cannot be bound.
    """
    where = _barrier_host(cluster)
    if where is None:
        say(
            f"milarun: warning: this host is not the main node {cluster.main.name}: the "
            "processes of concurrent tests start without the start barrier (run milarun "
            "jobs on the main node for synchronized starts)"
        )
        return contextlib.nullcontext(None)
    try:
        server = BarrierServer(where[0], connect=where[1], log=say)
    except OSError as exc:
        raise SetupError(
            f"cannot open the start barrier's socket on {where[0]}: {exc.strerror or exc}"
        )

    @contextlib.contextmanager
    def serving():
        try:
            with server:
                yield server
        finally:
            if server.strangers:
                say(
                    f"milarun: warning: the start barrier refused {server.strangers} "
                    f"connection(s) without this session's secret (from "
                    f"{', '.join(server.stranger_peers)}); none could release or hold "
                    "a wave"
                )

    return serving()


def _run(
    waves,
    outdir,
    dataroot,
    jobs_,
    devs,
    sid,
    done,
    removed,
    verbose,
    cluster=None,
    barrier=None,
    ignored=(),
    chain=None,
):
    """Run ``waves`` (what ``--resume`` left of them) under the live progress display and
    the signal handlers, then print the tally; returns the exit code of :func:`run_jobs`."""
    launches = [lch for wave in waves for lch in wave]
    where = (
        f" × {len(cluster.nodes)} nodes ({', '.join(n.name for n in cluster.nodes)}, "
        f"{cluster.kind})"
        if cluster is not None and cluster.multi
        else ""
    )
    say(
        f"milarun: {len(jobs_)} tests on {len(devs)} {devs.kind} device(s){where}; "
        f"session {sid}; results in {outdir}"
    )
    if removed:
        say(f"milarun: removed {len(removed)} stale temporary file(s) of an interrupted write")
    if ignored:
        say(_ignored_line(list(ignored), outdir))
    if done:
        say(f"milarun: --resume: {len(done)} launch(es) already passed; {len(launches)} to run")
    stop = StopRequest()

    def finished(outcome):
        if chain is not None:
            chain.outcome(outcome)
        progress.finished(outcome)

    def head(outcomes, status):
        # the chain head goes to the buyer as soon as the run ends (docs/tender.md)
        if chain is None:
            return ""
        return f"; manifest head {chain.end(outcomes, status)}"

    with stop_on_signals(stop), SuiteProgress(launches, verbose=verbose) as progress:
        if chain is not None:
            chain.on_message = progress.message
        try:
            outcomes = run_suite(
                waves,
                outdir,
                dataroot,
                stop=stop,
                on_line=progress.child_output,
                on_outcome=finished,
                on_wave=progress.started,
                barrier=barrier,
                on_message=progress.message,
            )
        except Interrupted as exc:
            name = signal.Signals(exc.signum).name
            progress.message(
                f"milarun: stopped by {name}; {tally(exc.outcomes)}; "
                f"results in {outdir}; continue with --resume {outdir}"
                f"{head(exc.outcomes, 'interrupted')}"
            )
            return 128 + exc.signum
        except SuiteAborted as exc:
            progress.message(
                f"milarun: error: {exc}; {tally(exc.outcomes)}; "
                f"results in {outdir}{head(exc.outcomes, 'aborted')}"
            )
            return 1
    try:
        print(tally(outcomes), flush=True)
    except (OSError, ValueError):
        pass
    say(f"milarun: results in {outdir}{head(outcomes, 'complete')}")
    return 0 if all(o.success for o in outcomes) else 1
