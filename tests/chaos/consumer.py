"""Stream or checkpoint consumers in a process of their own, so that the key-shared chaos run
(:mod:`tests.chaos.keyshared`) can SIGKILL them for real.

Child: ``python -m tests.chaos.consumer --kind stream|checkpoint --url U --namespace N --topic T
--subscription S --names C1,C2 [--store DIR]`` runs one consumer per name and prints every
message a consumer takes as a JSON line, with the time it took it (``time.monotonic``: one clock
for every process of the machine, so the pipe's delay does not reorder consumers), *before*
acknowledging it (stream) or recording it in
its checkpoint (checkpoint), so the parent's history holds every delivery the application saw.
A checkpoint consumer stores its checkpoint in ``DIR/<name>.json`` (atomically, every
``--checkpoint-every`` messages and when it leaves: what a SIGKILL loses is re-read after the
restore) and starts from the merge of every checkpoint in ``DIR`` (the consumers of one
subscription share a store). ``pause NAME`` / ``resume NAME`` lines on stdin stop and restart
taking messages (a consumer falling behind); a ``leave NAME`` line makes that consumer leave cleanly
(finish the message in hand, close and unregister, print ``{"e": "left"}``); ``SIGTERM`` or the
end of stdin makes all of them leave, and the process ends when none is left.

Parent: :class:`ConsumerProcess` feeds the lines into a :class:`~tests.chaos.workload.Recorder`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from scalable_topics.client import CheckpointConsumer, StreamConsumer
from scalable_topics.client.model import Checkpoint, Message

from .checker import RestartKind
from .workload import Recorder

__all__ = ["ConsumerProcess", "main", "stored_checkpoint"]

REPO = Path(__file__).resolve().parents[2]


def stored_checkpoint(store: Path, namespace: str, topic: str, subscription: str) -> Checkpoint:
    """The merge of every checkpoint in ``store`` (empty when there is none)."""
    merged = Checkpoint(namespace, topic, subscription)
    for path in sorted(store.glob("*.json")):
        merged = merged.merge(Checkpoint.from_json(json.loads(path.read_text("utf-8"))))
    return merged


def _store(store: Path, name: str, checkpoint: Checkpoint) -> None:
    path = store / f"{name}.json"
    partial = store / f".{name}.json.tmp"
    partial.write_text(json.dumps(checkpoint.to_json()), encoding="utf-8")
    os.replace(partial, path)


def _line(name: str, message: Message, at: float) -> str:
    return json.dumps(
        {
            "e": "msg",
            "c": name,
            "t": at,
            "k": message.key,
            "v": message.value.decode("latin-1"),
            "s": message.segment_id,
            "p": message.position,
            "i": message.batch_index,
            "n": message.batch_size,
        },
        separators=(",", ":"),
    )


async def _consume(
    args: argparse.Namespace, name: str, leave: asyncio.Event, go: asyncio.Event
) -> None:
    """One consumer: start (from the shared store, for a checkpoint consumer), take messages
    until ``leave``, then finish the message in hand, store, close and unregister."""
    store = Path(args.store) if args.store else None
    consumer: StreamConsumer | CheckpointConsumer
    start: Checkpoint | None = None
    if args.kind == "checkpoint":
        assert store is not None, "a checkpoint consumer needs --store"
        start = stored_checkpoint(store, args.namespace, args.topic, args.subscription)
        consumer = CheckpointConsumer(
            args.url,
            args.namespace,
            args.topic,
            args.subscription,
            name,
            start_from=start,
            permits=args.permits,
        )
    else:
        consumer = StreamConsumer(
            args.url, args.namespace, args.topic, args.subscription, name, permits=args.permits
        )
    await consumer.start()
    started: dict[str, Any] = {"e": "started", "c": name}
    if start is not None:
        started["checkpoint"] = start.to_json()
    print(json.dumps(started), flush=True)
    taken = 0
    receiving: asyncio.Future[Message] | None = None
    stopping = asyncio.ensure_future(leave.wait())
    try:
        while not leave.is_set():
            if not go.is_set():
                await asyncio.wait(
                    {asyncio.ensure_future(go.wait()), stopping},
                    return_when=asyncio.FIRST_COMPLETED,
                )
                continue
            receiving = asyncio.ensure_future(consumer.receive())
            await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not receiving.done():
                break
            message = receiving.result()
            receiving = None
            print(_line(name, message, time.monotonic()), flush=True)
            await asyncio.sleep(args.work)
            taken += 1
            if isinstance(consumer, StreamConsumer):
                consumer.ack_nowait(message)
            elif store is not None and taken % args.checkpoint_every == 0:
                _store(store, name, consumer.checkpoint())
    finally:
        stopping.cancel()
        if receiving is not None:
            receiving.cancel()
            with contextlib.suppress(BaseException):
                await receiving
    if isinstance(consumer, CheckpointConsumer) and store is not None:
        _store(store, name, consumer.checkpoint())
    await consumer.close(unregister=True)
    print(json.dumps({"e": "left", "c": name}), flush=True)


async def _child(args: argparse.Namespace) -> None:
    names = args.names.split(",")
    leave = {name: asyncio.Event() for name in names}
    go = {name: asyncio.Event() for name in names}
    for event in go.values():
        event.set()

    def everyone() -> None:
        for event in leave.values():
            event.set()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, everyone)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def commands() -> None:
        while line := await reader.readline():
            verb, _, name = line.decode().strip().partition(" ")
            if verb == "leave" and name in leave:
                leave[name].set()
            elif verb == "pause" and name in go:
                go[name].clear()
            elif verb == "resume" and name in go:
                go[name].set()
        everyone()

    listening = asyncio.create_task(commands())
    try:
        await asyncio.gather(*(_consume(args, name, leave[name], go[name]) for name in names))
    finally:
        listening.cancel()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.consumer")
    p.add_argument("--kind", choices=("stream", "checkpoint"), required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--namespace", default="default")
    p.add_argument("--topic", required=True)
    p.add_argument("--subscription", required=True)
    p.add_argument("--names", required=True, help="comma-separated consumer names")
    p.add_argument("--store", help="checkpoint store directory (checkpoint consumers)")
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--permits", type=int, default=64)
    p.add_argument("--work", type=float, default=0.0005, help="seconds of work per message")
    args = p.parse_args(argv)
    # stderr is the run's consumers.log: the SDK's hand-overs, reattaches and drains
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {args.names} %(name)s %(levelname)s %(message)s",
    )
    asyncio.run(_child(args))


class ConsumerProcess:
    """The parent's handle on one child; its deliveries land in ``recorder`` under
    ``(subscription, name, sessions[name])``."""

    def __init__(
        self,
        recorder: Recorder,
        proc: asyncio.subprocess.Process,
        *,
        kind: str,
        subscription: str,
        sessions: dict[str, int],
    ) -> None:
        self.recorder = recorder
        self.proc = proc
        self.kind = kind
        self.subscription = subscription
        self.sessions = dict(sessions)
        self.reads = dict.fromkeys(sessions, 0)
        loop = asyncio.get_running_loop()
        self.started = {name: loop.create_future() for name in sessions}
        self.left = {name: asyncio.Event() for name in sessions}
        self.kill_handles: list[int] = []
        """The recorder's restart handles of the SIGKILL (:meth:`kill`), one per consumer."""
        self._task = asyncio.create_task(self._pump(), name=f"consumers-{'-'.join(sessions)}")

    @classmethod
    async def spawn(
        cls,
        recorder: Recorder,
        *,
        kind: str,
        url: str,
        namespace: str,
        topic: str,
        subscription: str,
        sessions: dict[str, int],
        store: Path | None = None,
        stderr: IO[bytes] | None = None,
    ) -> ConsumerProcess:
        """Start one consumer per name of ``sessions`` (name -> session number)."""
        args = [
            f"--kind={kind}",
            f"--url={url}",
            f"--namespace={namespace}",
            f"--topic={topic}",
            f"--subscription={subscription}",
            f"--names={','.join(sessions)}",
        ]
        if store is not None:
            args.append(f"--store={store}")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.chaos.consumer",
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            cwd=REPO,
        )
        return cls(recorder, proc, kind=kind, subscription=subscription, sessions=sessions)

    async def _pump(self) -> None:
        assert self.proc.stdout is not None
        try:
            while raw := await self.proc.stdout.readline():
                line = json.loads(raw)
                event, name = line["e"], line["c"]
                if event == "msg":
                    message = Message(
                        key=line["k"],
                        value=line["v"].encode("latin-1"),
                        segment_id=line["s"],
                        position=line["p"],
                        batch_index=line["i"],
                        batch_size=line["n"],
                    )
                    session = self.sessions[name]
                    self.recorder.delivered(self.subscription, name, session, message, line["t"])
                    self.reads[name] += 1
                elif event == "started" and not self.started[name].done():
                    checkpoint = line.get("checkpoint")
                    if checkpoint is not None:
                        self.recorder.checkpoint_start(
                            self.subscription, name, self.sessions[name], checkpoint
                        )
                    self.started[name].set_result(None)
                elif event == "left":
                    self.left[name].set()
        finally:
            for name, future in self.started.items():
                if not future.done():
                    future.set_exception(RuntimeError(f"consumer {name} ended before it started"))

    async def wait_started(self, within: float) -> None:
        await asyncio.wait_for(asyncio.gather(*map(asyncio.shield, self.started.values())), within)

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    async def command(self, verb: str, name: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{verb} {name}\n".encode())
        await self.proc.stdin.drain()

    async def leave(self, name: str, within: float = 30.0) -> None:
        """Consumer ``name`` leaves cleanly (finishes the message in hand, closes and
        unregisters); every line it printed is recorded when this returns."""
        await self.command("leave", name)
        await asyncio.wait_for(self.left[name].wait(), within)
        if all(event.is_set() for event in self.left.values()):
            await asyncio.wait_for(self.proc.wait(), within)
            await self._task

    async def kill(self) -> list[int]:
        """SIGKILL, recorded as a restart of each of its consumers that begins now (the caller
        ends one with :meth:`Recorder.restarted` when a new session of the name started);
        returns once every line it printed is recorded."""
        self.kill_handles = [
            self.recorder.restart(RestartKind.CONSUMER, name, self.subscription)
            for name in self.sessions
        ]
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        await self._task
        return self.kill_handles

    async def stop(self) -> None:
        """Cleanup: kill it if it still runs."""
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        with contextlib.suppress(Exception):
            await self._task


if __name__ == "__main__":
    main()
