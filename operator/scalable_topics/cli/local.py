"""``stopic local up|down|reset``: the local cluster (the real control plane and our kubelet)
on a data directory (``localcluster.cluster.LocalCluster``, docs/localcluster.md).

One control plane per directory: ``up`` (and ``stopic demo``) take the directory's lock before
writing anything there (``localcluster.datadir``), so a second one exits at once with status
:data:`~scalable_topics.localcluster.datadir.EXIT_IN_USE`, naming the running one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ..localcluster.datadir import (
    EXIT_IN_USE,
    DataDirInUse,
    Holder,
    NotADataDir,
    reset,
    running,
)

DEFAULT_STOP_GRACE = 0.5
"""Seconds the pods get between SIGTERM and SIGKILL when the control plane stops, so that
Ctrl-C ends ``local up`` and the demo within 5 s, the control plane's own stop included
(brokers and the operator are crash-safe)."""


def err(text: str) -> None:
    print(f"stopic: {text}", file=sys.stderr, flush=True)


class UnusableDataDir(Exception):
    """The data directory cannot be read or written (a file, no permission, ...)."""


def holder_of(data_dir: Path) -> Holder | None:
    """The running control plane of ``data_dir`` (``None``: none), or ``UnusableDataDir``."""
    try:
        return running(data_dir)
    except OSError as exc:
        raise UnusableDataDir(f"cannot use {data_dir} as a data directory: {exc.strerror}") from exc


def refuse_start(data_dir: Path) -> int | None:
    """The exit status refusing to start a control plane on ``data_dir`` (having said why on
    stderr) when it cannot be used or another one holds it; ``None``: go ahead. The start takes
    the lock and would refuse too, but only after its set-up."""
    try:
        holder = holder_of(data_dir)
    except UnusableDataDir as exc:
        err(str(exc))
        return 1
    if holder is not None:
        err(str(DataDirInUse(data_dir, holder)))
        return EXIT_IN_USE
    return None


def shell_setup(kubeconfig: Path, kubectl: Path | None = None) -> list[str]:
    """The lines that make ``kubectl``, ``stopic`` and ``kubectl stopic`` work, against this
    cluster, in a new terminal (where the virtualenv's ``bin`` is not on ``PATH``).

    ``kubectl`` (``DIR/bin/kubectl``, the pinned release's) goes first on ``PATH``, so the
    ``kubectl`` typed there is the one that matches the server, not the machine's."""
    lines = [f"export KUBECONFIG={shlex.quote(str(kubeconfig))}"]
    dirs: list[Path] = []
    if kubectl is not None and kubectl.exists():
        dirs.append(kubectl.parent.absolute())
    bindir = Path(sys.executable).parent
    if not (bindir / "kubectl-stopic").exists():
        found = shutil.which("kubectl-stopic")
        bindir = Path(found).parent if found else bindir
    if (bindir / "kubectl-stopic").exists():
        dirs.append(bindir.absolute())
    if dirs:
        path = ":".join(shlex.quote(str(d)) for d in dirs)
        lines.append(f'export PATH={path}:"$PATH"')
    return lines


def cmd_local_up(args: argparse.Namespace) -> int:
    """Run the local cluster in the foreground until Ctrl-C or SIGTERM."""
    data_dir = Path(args.data_dir).absolute()
    refused = refuse_start(data_dir)
    if refused is not None:
        return refused

    from ..localcluster.cluster import LocalCluster
    from ..localcluster.controlplane import ControlPlaneError

    async def run() -> int:
        cluster = LocalCluster(
            data_dir,
            api_port=args.api_port,
            kubelet=not args.no_kubelet,
            stop_grace=args.stop_grace,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        starting = asyncio.create_task(cluster.start())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            # Ctrl-C while starting: the start's own clean-up stops what it had started.
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return 0
        failure = starting.exception()
        if failure is not None:
            stopping.cancel()
            if isinstance(failure, DataDirInUse):
                err(str(failure))
                return EXIT_IN_USE
            if isinstance(failure, ControlPlaneError | OSError):
                err(str(failure))
                return 1
            raise failure
        print(
            f"local control plane serving on {cluster.url} "
            f"(pid {os.getpid()}, data dir {cluster.data_dir})",
            flush=True,
        )
        print(f"kubeconfig: {cluster.kubeconfig} (admin)", flush=True)
        print(f"kubectl: {cluster.kubectl} (the server's release)", flush=True)
        print("In another terminal:", flush=True)
        for line in shell_setup(cluster.kubeconfig, cluster.kubectl):
            print(f"    {line}", flush=True)
        print("    kubectl version", flush=True)
        print("    kubectl get nodes,namespaces", flush=True)
        print(
            f"Stop: Ctrl-C here, or `stopic local down --data-dir {shlex.quote(str(data_dir))}`.",
            flush=True,
        )
        try:
            await stopping
        finally:
            print("stopping the local control plane…", file=sys.stderr, flush=True)
            await cluster.stop()
        return 0

    return asyncio.run(run())


def cmd_local_down(args: argparse.Namespace) -> int:
    """Stop the control plane holding ``--data-dir`` (SIGTERM to the lock holder), and wait
    until it has released the directory."""
    data_dir = Path(args.data_dir).absolute()
    try:
        holder = holder_of(data_dir)
    except UnusableDataDir as exc:
        err(str(exc))
        return 1
    if holder is None:
        err(f"no local control plane is running on {data_dir}")
        return 1
    if holder.pid <= 0:
        err(f"{data_dir} is locked but its holder is not recorded; stop that process yourself")
        return 1
    try:
        os.kill(holder.pid, signal.SIGTERM)
    except ProcessLookupError:
        err(f"{data_dir} is locked, but not by pid {holder.pid} it records (just starting?)")
        return 1
    deadline = time.monotonic() + args.timeout
    while running(data_dir) is not None:
        if time.monotonic() > deadline:
            err(f"local control plane (pid {holder.pid}) did not stop within {args.timeout:g}s")
            return 1
        time.sleep(0.05)
    print(f"local control plane (pid {holder.pid}) stopped")
    return 0


def cmd_local_reset(args: argparse.Namespace) -> int:
    """Remove the state of a stopped control plane (refused while one runs)."""
    data_dir = Path(args.data_dir).absolute()
    try:
        result = reset(data_dir)
    except DataDirInUse as exc:
        err(str(exc))
        return EXIT_IN_USE
    except (NotADataDir, OSError) as exc:
        err(str(exc))
        return 1
    if not result.removed:
        print(f"{data_dir}: nothing to reset")
        return 0
    print(f"{data_dir}: removed {', '.join(result.removed)}")
    if result.kept:
        print(f"  kept what the control plane did not create: {', '.join(result.kept)}")
    elif result.directory_removed:
        print("  (and the directory, now empty)")
    return 0


def _data_dir(parser: argparse.ArgumentParser, **kwargs: Any) -> None:
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the cluster's directory: etcd's data (objects survive restarts), certificates, "
        "kubeconfigs, logs, lock, and the kubelet's pod logs and volumes",
        **kwargs,
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``stopic local`` and its subcommands."""
    local = sub.add_parser(
        "local",
        help="the local cluster: the real control plane and one node (development only)",
        description="The local cluster: etcd, kube-apiserver, kube-controller-manager and "
        "kube-scheduler of the pinned Kubernetes release, and our kubelet running Pods as local "
        "processes, all on 127.0.0.1. One per data directory: a second `up` on a directory in "
        f"use exits with status {EXIT_IN_USE}.",
    )
    local_sub = local.add_subparsers(dest="local_command", required=True)

    up = local_sub.add_parser(
        "up",
        help="run the local control plane in the foreground",
        description="Run the local cluster in the foreground until Ctrl-C or SIGTERM (the first "
        "run builds the Kubernetes binary: see the README). Writes DIR/kubeconfig (admin) and "
        "DIR/bin/kubectl (the pinned kubectl). "
        f"Exits with status {EXIT_IN_USE} at once if another one holds --data-dir.",
    )
    _data_dir(up, required=True)
    up.add_argument(
        "--api-port",
        type=int,
        default=0,
        metavar="PORT",
        help="API port on 127.0.0.1 (default 0: any free port; the kubeconfig names it)",
    )
    up.add_argument("--no-kubelet", action="store_true", help="serve the API only; run no pods")
    up.add_argument(
        "--stop-grace",
        type=float,
        default=DEFAULT_STOP_GRACE,
        metavar="SECONDS",
        help="on stop, how long pods get between SIGTERM and SIGKILL "
        f"(default {DEFAULT_STOP_GRACE:g}; a pod's own shorter grace period wins)",
    )
    up.set_defaults(func=cmd_local_up)

    down = local_sub.add_parser(
        "down",
        help="stop the local control plane running on --data-dir",
        description="Send SIGTERM to the process holding --data-dir and wait until it has "
        "released it. Exit status 1 if none runs there.",
    )
    _data_dir(down, required=True)
    down.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for it to stop (default 30)",
    )
    down.set_defaults(func=cmd_local_down)

    reset_parser = local_sub.add_parser(
        "reset",
        help="delete a stopped control plane's state in --data-dir (start from scratch)",
        description="Remove every object (etcd's data), the certificates, the kubeconfigs, the "
        "components' logs and the pods' logs and volumes from --data-dir. Only files the "
        "control plane created are removed, and only in a directory it has marked as its own; "
        "refused (status "
        f"{EXIT_IN_USE}) while a control plane runs there.",
    )
    _data_dir(reset_parser, required=True)
    reset_parser.set_defaults(func=cmd_local_reset)
