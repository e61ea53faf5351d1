"""The ``stopic`` command (also installed as the kubectl plugin ``kubectl-stopic``).

One function per subcommand; each registers its parser in :func:`build_parser` and is
dispatched through ``args.func``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def cmd_local_up(args: argparse.Namespace) -> int:
    """Run the embedded cluster in the foreground until Ctrl-C or SIGTERM."""
    from scalable_topics.localcluster.cluster import KubeletUnavailable, LocalCluster

    async def run() -> int:
        cluster = LocalCluster(
            Path(args.data_dir), api_port=args.api_port, kubelet=not args.no_kubelet
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await cluster.start()
        except KubeletUnavailable as exc:
            print(f"stopic: {exc}", file=sys.stderr)
            return 1
        cluster.write_pid_file()
        print(f"API server: {cluster.url}", flush=True)
        print(f"kubeconfig: {cluster.kubeconfig}", flush=True)
        print(f"  export KUBECONFIG={cluster.kubeconfig}", flush=True)
        try:
            await stop.wait()
        finally:
            print("stopping the local cluster…", file=sys.stderr, flush=True)
            await cluster.stop()
            cluster.remove_pid_file()
        return 0

    return asyncio.run(run())


def cmd_local_down(args: argparse.Namespace) -> int:
    """Stop the cluster running on ``--data-dir`` (SIGTERM to the pid in its pid file)."""
    from scalable_topics.localcluster.cluster import PID_FILE

    pid_file = Path(args.data_dir) / PID_FILE
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        print(f"stopic: no local cluster is running on {args.data_dir}", file=sys.stderr)
        return 1
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"stopic: stale pid file (process {pid} is gone); removing it", file=sys.stderr)
        pid_file.unlink(missing_ok=True)
        return 1
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print(f"local cluster (pid {pid}) stopped")
            return 0
        time.sleep(0.1)
    print(f"stopic: local cluster (pid {pid}) did not stop within {args.timeout}s", file=sys.stderr)
    return 1


def _add_local(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    local = sub.add_parser("local", help="the embedded local control plane (development only)")
    local_sub = local.add_subparsers(dest="local_command", required=True)

    up = local_sub.add_parser("up", help="run the local cluster in the foreground")
    up.add_argument("--data-dir", required=True, help="directory for state, kubeconfig and logs")
    up.add_argument("--api-port", type=int, default=0, help="API port on 127.0.0.1 (0: any free)")
    up.add_argument("--no-kubelet", action="store_true", help="serve the API only; run no pods")
    up.set_defaults(func=cmd_local_up)

    down = local_sub.add_parser("down", help="stop the local cluster running on --data-dir")
    down.add_argument("--data-dir", required=True)
    down.add_argument("--timeout", type=float, default=30.0)
    down.set_defaults(func=cmd_local_down)


def _topic_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from . import clients, demo, topics

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", default="default")
    common.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    topics.add_parsers(sub, common)
    clients.add_parsers(sub, common)
    for name in ("dag", "split", "merge", "produce", "consume", "bench"):
        sub.choices[name].set_defaults(func=topics.run_async)
    demo.add_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stopic", description="Scalable Topics command line")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_local(sub)
    _topic_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    with contextlib.suppress(KeyboardInterrupt):
        rc: int = args.func(args)
        return rc
    return 130


if __name__ == "__main__":
    sys.exit(main())
