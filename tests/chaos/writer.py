"""The chaos writer in a process of its own, so that the producer's event loop does not share a
core's time slices with the test's (which runs the embedded API server, the kubelet and the
consumers): the producer-blocked windows then measure the system, not the harness.

Child: ``python -m tests.chaos.writer --url U --namespace N --topic T --keys K --rate R`` runs an
:class:`~tests.chaos.workload.OpenLoopWriter` and reports every send as a JSON line on stdout
(``time.monotonic`` is one clock for all processes of the machine); a ``stop`` line on stdin
stops the writing, the child waits for the outstanding acknowledgements and ends with a
``done`` line. Parent: :class:`WriterProcess` feeds those lines into a
:class:`~tests.chaos.workload.Recorder`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from scalable_topics.client import MessageId, ScalableTopicProducer

from .workload import OpenLoopWriter, Recorder

__all__ = ["WriterProcess", "main"]

log = logging.getLogger("tests.chaos.writer")

REPO = Path(__file__).resolve().parents[2]


class _JsonLines:
    """A :class:`~tests.chaos.workload.SendLog` writing one JSON line per event."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def clock(self) -> float:
        return time.monotonic()

    def _emit(self, body: dict[str, Any]) -> None:
        self.out.write(json.dumps(body, separators=(",", ":")) + "\n")

    def invoke(self, key: str, value: int, at: float) -> None:
        self._emit({"e": "invoke", "k": key, "v": value, "t": at})

    def ok(self, key: str, value: int, message_id: MessageId, at: float | None = None) -> None:
        self._emit(
            {
                "e": "ok",
                "k": key,
                "v": value,
                "t": self.clock() if at is None else at,
                "s": message_id.segment_id,
                "p": message_id.position,
            }
        )

    def fail(self, key: str, value: int, at: float | None = None) -> None:
        self._emit({"e": "fail", "k": key, "v": value, "t": self.clock() if at is None else at})

    def info(self, key: str, value: int, at: float | None = None) -> None:
        self._emit({"e": "info", "k": key, "v": value, "t": self.clock() if at is None else at})


async def _child(args: argparse.Namespace) -> None:
    sink = _JsonLines(sys.stdout)
    keys = [f"key-{i}" for i in range(args.keys)]
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with ScalableTopicProducer(
        args.url, args.namespace, args.topic, name=args.producer
    ) as producer:
        writer = OpenLoopWriter(producer, sink, keys, args.rate, pad=args.pad)
        writer.start()
        sys.stdout.write(json.dumps({"e": "started", "t": sink.clock()}) + "\n")
        while (line := await reader.readline()) and line.strip() != b"stop":
            pass
        unanswered = await writer.stop(args.drain)
        sys.stdout.write(
            json.dumps({"e": "done", "unanswered": unanswered, "lag": writer.behind_max}) + "\n"
        )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.writer")
    p.add_argument("--url", required=True)
    p.add_argument("--namespace", default="default")
    p.add_argument("--topic", required=True)
    p.add_argument("--producer", default="chaos-writer")
    p.add_argument("--keys", type=int, default=64)
    p.add_argument("--rate", type=float, default=400.0)
    p.add_argument("--pad", type=int, default=64)
    p.add_argument("--drain", type=float, default=30.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # one line is one event: the parent must see it as it happens (a write per line, ~800/s)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    asyncio.run(_child(args))


class WriterProcess:
    """The parent's handle on a writer child; its sends land in ``recorder``."""

    def __init__(self, recorder: Recorder, proc: asyncio.subprocess.Process) -> None:
        self.recorder = recorder
        self.proc = proc
        self.unanswered = 0
        self.behind_max = 0.0
        self.started = asyncio.get_running_loop().create_future()
        self._done = asyncio.Event()
        self._task = asyncio.create_task(self._pump(), name="chaos-writer-pipe")

    @classmethod
    async def spawn(
        cls,
        recorder: Recorder,
        *,
        url: str,
        namespace: str,
        topic: str,
        keys: int,
        rate: float,
        pad: int,
        stderr: IO[bytes] | None = None,
    ) -> WriterProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.chaos.writer",
            f"--url={url}",
            f"--namespace={namespace}",
            f"--topic={topic}",
            f"--keys={keys}",
            f"--rate={rate}",
            f"--pad={pad}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            cwd=REPO,
        )
        return cls(recorder, proc)

    async def _pump(self) -> None:
        assert self.proc.stdout is not None
        r = self.recorder
        try:
            while line := await self.proc.stdout.readline():
                body = json.loads(line)
                event = body["e"]
                if event == "invoke":
                    r.invoke(body["k"], body["v"], body["t"])
                elif event == "ok":
                    r.ok(body["k"], body["v"], MessageId(body["s"], body["p"]), body["t"])
                elif event == "info":
                    r.info(body["k"], body["v"], body["t"])
                elif event == "fail":
                    r.fail(body["k"], body["v"], body["t"])
                elif event == "started":
                    if not self.started.done():
                        self.started.set_result(body["t"])
                elif event == "done":
                    self.unanswered = int(body["unanswered"])
                    self.behind_max = float(body["lag"])
                    self._done.set()
        finally:
            if not self.started.done():
                self.started.set_exception(RuntimeError("the writer process ended early"))

    async def wait_started(self, within: float) -> float:
        return await asyncio.wait_for(asyncio.shield(self.started), within)

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    async def stop(self, within: float) -> int:
        """Stop writing; wait for the child's final report and exit. Returns the number of
        sends left without an answer (``info`` in the history)."""
        if self.proc.returncode is None and self.proc.stdin is not None:
            with contextlib.suppress(ConnectionError):
                self.proc.stdin.write(b"stop\n")
                await self.proc.stdin.drain()
        try:
            await asyncio.wait_for(self.proc.wait(), within)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        await self._task
        if not self._done.is_set():
            raise AssertionError(
                f"the writer process ended without a report ({self.proc.returncode})"
            )
        return self.unanswered


if __name__ == "__main__":
    main()
