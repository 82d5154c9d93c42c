"""The hardware identity of every node of a session (:mod:`milarun.host.identity`), for the
session file (:func:`milarun.launcher.session.record_session`).

This host alone: :func:`milarun.host.identity.identity`, called here. Several nodes (Slurm,
a system file): ``python -m milarun.host.identity`` runs once on each node, all at
once, through the cluster's own transport (:meth:`milarun.plan.nodes.Cluster.on_nodes`:
``srun`` or ``ssh``, as every launch), and its standard output is read as data: at most
:data:`~milarun.host.identity.MAX_IDENTITY_BYTES`, parsed by the strict JSON reader,
and kept only when it is an identity object. A node whose answer is missing, late,
malformed or too large gets ``{"error": "why"}`` instead; a session never stops for it
(verify names such a node).

Each identity holds its node's host prescreen (``config.node.prescreen``,
:mod:`milarun.host.prescreen`): :func:`show_prescreen` prints the findings that failed or are
unknown before the first launch, and says which ``--prescreen-fatal`` findings stop the suite.
"""

import os
import signal
import subprocess
import threading
import time
from typing import Any

from ..errors import MilarunError, say
from ..formats.jsonfile import parse_json
from ..formats.terminal import one_line, terminal_safe
from ..host.identity import IDENTITY_FORMAT, MAX_IDENTITY_BYTES, identity
from ..host.prescreen import fatal_problems, finding_line, findings_of, not_ok

#: Seconds all nodes together have to answer.
IDENTITY_TIMEOUT_S = 60.0
#: The module each node runs.
IDENTITY_MODULE = "milarun.host.identity"


def _read_bounded(stream, limit, into):
    """Read at most ``limit`` + 1 bytes of ``stream`` into ``into`` (a list), then stop."""
    try:
        into.append(stream.read(limit + 1))
    except (OSError, ValueError):
        into.append(b"")


def parse_answer(raw, node):
    """A node's identity from its standard output ``raw`` (bytes): the object, or
    ``{"error": "why"}`` when it is empty, larger than
    :data:`~milarun.host.identity.MAX_IDENTITY_BYTES`, not strict JSON, or not an
    identity object. Never raises."""
    if not raw or not raw.strip():
        return {"error": "no answer on standard output"}
    if len(raw) > MAX_IDENTITY_BYTES:
        return {"error": f"answer larger than {MAX_IDENTITY_BYTES} bytes"}
    try:
        data = parse_json(raw, path=f"node {node}")
    except MilarunError as exc:
        return {"error": f"malformed answer: {str(exc)[:300]}"}
    if not isinstance(data, dict) or data.get("format") != IDENTITY_FORMAT:
        return {"error": f"not a milarun identity (format is not {IDENTITY_FORMAT!r})"}
    return data


def collect(cluster, timeout=IDENTITY_TIMEOUT_S, local=identity):
    """``{node name: identity}`` of every node of ``cluster`` (a
    :class:`milarun.plan.nodes.Cluster`); a node that did not answer with one gets
    ``{"error": "why"}``. Never raises for a node's failure.

    Args:
        timeout: seconds for all nodes together (s); a node still running then is killed.
        local: this host's reading (a one-node local cluster: called directly).
    """
    if cluster.kind == "local" and not cluster.multi:
        return {cluster.main.name: local()}
    running: list[tuple[Any, subprocess.Popen | None, str | None, list, list]] = []
    for node in cluster.nodes:  # every node at once: one timeout in all
        argv, env = cluster.on_nodes(
            [cluster.python, "-m", IDENTITY_MODULE], {}, [node.name], tag="milarun-identity"
        )
        try:
            # a group of its own: a late answer is ended with everything it started
            started = subprocess.Popen(
                argv,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            running.append((node, None, f"cannot run {argv[0]}: {exc.strerror or exc}", [], []))
            continue
        out: list = []
        err: list = []
        for stream, into in ((started.stdout, out), (started.stderr, err)):
            threading.Thread(
                target=_read_bounded, args=(stream, MAX_IDENTITY_BYTES, into), daemon=True
            ).start()
        running.append((node, started, None, out, err))
    deadline = time.monotonic() + timeout
    found = {}
    for node, proc, failed, out, err in running:
        if proc is None:
            found[node.name] = {"error": failed}
            continue
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            found[node.name] = {"error": f"no answer within {timeout:g} s"}
        for _ in range(50):  # the readers finish once the pipes close
            if out and err:
                break
            time.sleep(0.01)
        if out and err:  # else a reader still blocks on a pipe something kept open: left
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        if node.name in found:
            continue
        if proc.returncode != 0:
            tail = (err[0] if err else b"").decode("utf-8", "replace").strip().splitlines()
            found[node.name] = {
                "error": f"exit status {proc.returncode}" + (f": {tail[-1][:300]}" if tail else "")
            }
            continue
        found[node.name] = parse_answer(out[0] if out else b"", node.name)
    return found


def show_prescreen(found, fatal=(), log=say):
    """Print (``log``) one ``milarun: prescreen: …`` line per finding that failed, one
    naming the unknown ones, of every node of ``found`` (``{node: identity}``,
    :func:`collect`), and one per node whose identity holds no prescreen. Returns the
    lines of the findings named in ``fatal`` that are not ok
    (:func:`milarun.host.prescreen.fatal_problems`): the caller stops on them."""
    by_node = {}
    for node, ident in sorted(found.items(), key=lambda kv: str(kv[0])):
        findings = findings_of(ident)
        by_node[node] = findings
        if findings is None:
            why = ident.get("error") if isinstance(ident, dict) else None
            line = f"milarun: prescreen: {node}: not read ({why or 'no prescreen in its identity'})"
            log(terminal_safe(one_line(line)))
            continue
        unknown = []
        for f in not_ok(findings):  # another node's text: shown, never acted on
            if f.get("ok") is None:
                unknown.append(str(f.get("name")))
                continue
            log(terminal_safe(one_line(f"milarun: prescreen: {finding_line(node, f)}")))
        if unknown:  # one line: a CPU host has no GPU nor InfiniBand finding to read
            line = (
                f"milarun: prescreen: {node}: {len(unknown)} unknown ({', '.join(unknown)}): "
                "milarun jobs --dry-run says why"
            )
            log(terminal_safe(one_line(line)))
    return fatal_problems(by_node, list(fatal)) if fatal else []
