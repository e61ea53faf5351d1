"""``stopic produce|consume|bench``: the SDK from the command line.

The operator is found from the topic (:mod:`.discovery`) unless ``--service-url`` names it.
Every HTTP session is the command's own and is closed on every path; starting the SDK is
bounded by :data:`START_TIMEOUT` and closing it by :data:`CLOSE_TIMEOUT`, or by
:data:`INTERRUPTED_CLOSE` after Ctrl-C, so that an interrupted command ends within two seconds.
Output formats are documented in ``docs/client.md`` ("CLI").
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import itertools
import json
import logging
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp

from ..client import (
    AccessDeniedError,
    ConsumerError,
    Message,
    MessageId,
    QueueConsumer,
    ScalableTopicProducer,
    StreamConsumer,
    TopicNotFoundError,
)
from ..core.subscriptions import SubscriptionType
from ..credentials import CA_FILE_ENV, TOKEN_FILE_ENV, CredentialsError, client_session
from . import args as cli_args
from .discovery import DEFAULT_OPERATOR_NAMESPACE, Target, find_operator
from .errors import CliError, NotFoundError, UnreachableError, UsageError, stdout_gone

log = logging.getLogger("scalable_topics.cli")

START_TIMEOUT = 10.0
"""Seconds to get the topic's DAG (and, for a consumer, its first assignment)."""
CLOSE_TIMEOUT = 10.0
"""Seconds a producer or consumer gets to close after a normal end."""
INTERRUPTED_CLOSE = 1.2
"""... and after Ctrl-C (whatever is not acknowledged by then is reported, not waited for)."""

TYPE_CHOICES = {kind.lower(): kind for kind in SubscriptionType}
"""``consume --type``: the spec's subscription types, spelled in lower case."""

_NOT_FOUND_CODES = {"InvalidSubscription", "UnknownTopic"}


# -- shared plumbing -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _connected(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[aiohttp.ClientSession, Target]]:
    """The command's HTTP session and the operator found for ``args.topic``."""
    try:
        session = client_session(args.token_file, ca_file=args.ca_file)
    except CredentialsError as exc:
        raise UsageError(str(exc)) from None
    async with session:
        target = await find_operator(
            session,
            namespace=args.namespace,
            topic=args.topic,
            service_url=args.service_url,
            kubeconfig=args.kubeconfig,
            operator_namespace=args.operator_namespace,
            request_timeout=args.request_timeout,
        )
        log.debug("operator for %s/%s: %s", args.namespace, args.topic, target.service_url)
        yield session, target


def sdk_error(exc: BaseException, what: str) -> CliError | None:
    """The CLI error for an SDK failure (``None``: not one the CLI knows)."""
    if isinstance(exc, TopicNotFoundError):
        return NotFoundError(f"{what}: {exc}")
    if isinstance(exc, AccessDeniedError):
        return CliError(f"{what}: access denied: {exc}")
    if isinstance(exc, ConsumerError):
        if exc.code in _NOT_FOUND_CODES:
            return NotFoundError(f"{what}: {exc}")
        return CliError(f"{what}: {exc}")
    return None


async def _start(what: str, url: str, start: Awaitable[Any]) -> None:
    try:
        async with asyncio.timeout(START_TIMEOUT):
            await start
    except TimeoutError:
        raise UnreachableError(
            f"{what}: not ready within {START_TIMEOUT:g}s (operator {url}; are the topic's "
            "controller and brokers reachable from here?)"
        ) from None
    except (TopicNotFoundError, ConsumerError, AccessDeniedError) as exc:
        raise sdk_error(exc, what) or exc from None


async def _close(what: str, close: Callable[[float], Awaitable[None]], interrupted: bool) -> None:
    """Close within a bound; a close that takes longer is reported and abandoned."""
    limit = INTERRUPTED_CLOSE if interrupted else CLOSE_TIMEOUT
    try:
        async with asyncio.timeout(limit):
            await close(limit)
    except TimeoutError:
        print(f"stopic: {what} did not close within {limit:g}s; gave up", file=sys.stderr)
    except Exception as exc:  # the command's own outcome matters more than a failed close
        log.debug("closing the %s failed: %r", what, exc)


def _format_id(message_id: MessageId) -> str:
    return f"{message_id.segment_id}:{message_id.position}:{message_id.batch_index}"


# -- produce -------------------------------------------------------------------------------------


class _Sent:
    """What a produce run sent and what the brokers acknowledged."""

    def __init__(self, verbose_ids: bool) -> None:
        self.verbose_ids = verbose_ids
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.first_error: BaseException | None = None
        self.futures: set[asyncio.Future[MessageId]] = set()

    def track(self, future: asyncio.Future[MessageId], key: str | None) -> None:
        self.sent += 1
        self.futures.add(future)
        future.add_done_callback(lambda f: self._done(f, key))

    def _done(self, future: asyncio.Future[MessageId], key: str | None) -> None:
        self.futures.discard(future)
        if future.cancelled():
            self.failed += 1
            return
        error = future.exception()
        if error is not None:
            self.failed += 1
            self.first_error = self.first_error or error
            return
        self.acked += 1
        if self.verbose_ids:
            try:
                print(f"{key or ''}\t{_format_id(future.result())}", flush=True)
            except BrokenPipeError:
                self.verbose_ids = False
                stdout_gone()

    async def wait(self) -> None:
        if self.futures:
            await asyncio.wait(set(self.futures))

    def unacknowledged(self) -> int:
        return self.sent - self.acked - self.failed


def _payload(index: int, size: int) -> bytes:
    return f"message-{index}".encode().ljust(size, b".")


async def _pace(started: float, index: int, rate: float) -> None:
    if rate:
        delay = started + index / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def _read_stdin(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[bytes | None]) -> None:
    """Feed stdin's lines (without their newline) to ``queue`` from a daemon thread: a blocking
    read on the event loop would keep Ctrl-C from being handled. It reads the file descriptor
    itself: a thread blocked inside ``sys.stdin.buffer`` holds its lock, which the interpreter
    needs at exit."""
    fd = sys.stdin.fileno()
    pending = b""

    def put(item: bytes | None) -> None:
        asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()

    try:
        while chunk := os.read(fd, 1 << 16):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                put(line)
        if pending:
            put(pending)
        put(None)
    except (RuntimeError, OSError, concurrent.futures.CancelledError):
        return  # the loop or stdin closed under us


async def _produce_stdin(
    args: argparse.Namespace, producer: ScalableTopicProducer, sent: _Sent
) -> None:
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=1024)
    reader = threading.Thread(
        target=_read_stdin, args=(asyncio.get_running_loop(), queue), daemon=True
    )
    reader.start()
    separator = args.separator.encode()
    started = time.monotonic()
    while (line := await queue.get()) is not None:
        key_bytes, found, value = line.partition(separator)
        if not found:
            key_bytes, value = b"", line
        key = key_bytes.decode("utf-8", "surrogateescape") or None
        await _pace(started, sent.sent, args.rate)
        sent.track(await producer.send_async(value, key=key_bytes or None), key)


async def _produce_count(
    args: argparse.Namespace, producer: ScalableTopicProducer, sent: _Sent
) -> None:
    names = [f"{args.key_prefix}{i}" for i in range(args.keys)]
    keys = itertools.cycle([None] if args.no_keys else names)
    started = time.monotonic()
    for index in range(args.count):
        await _pace(started, index, args.rate)
        key = next(keys)
        sent.track(await producer.send_async(_payload(index, args.size), key=key), key)


async def cmd_produce(args: argparse.Namespace) -> int:
    """Send ``--count`` messages, or one per line of stdin with ``--stdin``."""
    sent = _Sent(args.verbose_ids)
    started = time.monotonic()
    interrupted = running = False
    async with _connected(args) as (session, target):
        producer = ScalableTopicProducer(
            target.service_url, args.namespace, args.topic, name=args.name, session=session
        )
        what = f"producer for {args.namespace}/{args.topic}"
        try:
            await _start(what, target.service_url, producer.start())
            running = True
            if args.stdin:
                await _produce_stdin(args, producer, sent)
            else:
                await _produce_count(args, producer, sent)
            await sent.wait()
        except asyncio.CancelledError:
            interrupted = True
            raise
        finally:
            await _close("producer", lambda limit: producer.close(within=limit / 2), interrupted)
            if running:
                _report_produce(sent, time.monotonic() - started, interrupted)
    if sent.failed:
        first = sent.first_error
        mapped = sdk_error(first, what) if first is not None else None
        raise (type(mapped) if mapped is not None else CliError)(
            f"{sent.failed} of {sent.sent} message(s) failed; the first: {first}"
        )
    return 0


def _check_produce(args: argparse.Namespace) -> str | None:
    """Cross-option rules argparse cannot say; fills in the generated-message defaults."""
    generated = [
        flag
        for flag, value in (
            ("--count", args.count),
            ("--keys", args.keys),
            ("--no-keys", args.no_keys or None),
            ("--size", args.size),
        )
        if value is not None
    ]
    if args.stdin and generated:
        return f"{', '.join(generated)}: only for generated messages, not with --stdin"
    args.count = 1000 if args.count is None else args.count
    args.keys = 100 if args.keys is None else args.keys
    args.size = 0 if args.size is None else args.size
    return None


def _report_produce(sent: _Sent, elapsed: float, interrupted: bool) -> None:
    if interrupted:
        line = (
            f"interrupted: {sent.acked} of {sent.sent} message(s) acknowledged"
            + (f", {sent.unacknowledged()} not acknowledged" if sent.unacknowledged() else "")
            + (f", {sent.failed} failed" if sent.failed else "")
        )
    elif not sent.failed:
        line = (
            f"sent {sent.acked} message(s) in {elapsed:.2f}s "
            f"({sent.acked / max(elapsed, 1e-9):,.0f} msg/s)"
        )
    else:
        return
    print(line, file=sys.stderr)


# -- consume -------------------------------------------------------------------------------------


def _rfc3339_ms(epoch_ms: int) -> str:
    moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def _text_field(record: dict[str, Any], name: str, data: bytes | None) -> None:
    """``name``: the UTF-8 text, or ``<name>Base64`` when the bytes are not UTF-8."""
    if data is None:
        record[name] = None
        return
    try:
        record[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        record[name + "Base64"] = base64.b64encode(data).decode("ascii")


def format_message(message: Message, output: str) -> bytes:
    """One line of ``consume`` output (``docs/client.md``, "CLI")."""
    if output == "json":
        record: dict[str, Any] = {
            "segment": message.segment_id,
            "position": message.position,
            "batchIndex": message.batch_index,
        }
        _text_field(record, "key", message.key_bytes)
        _text_field(record, "value", message.value)
        if message.publish_time_ms:
            record["publishTime"] = _rfc3339_ms(message.publish_time_ms)
        if message.event_time_ms is not None:
            record["eventTime"] = _rfc3339_ms(message.event_time_ms)
        if message.properties:
            record["properties"] = dict(message.properties)
        if message.redelivery_count:
            record["redeliveryCount"] = message.redelivery_count
        return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    return (message.key_bytes or b"") + b"\t" + message.value + b"\n"


async def cmd_consume(args: argparse.Namespace) -> int:
    """Print messages (acknowledging each) until ``--count`` or Ctrl-C."""
    name = args.name or f"stopic-{uuid.uuid4().hex[:8]}"
    received = 0
    interrupted = running = False
    out = sys.stdout.buffer
    async with _connected(args) as (session, target):
        kind = target.subscription_type(args.subscription)
        wanted = None if args.type is None else TYPE_CHOICES[args.type]
        if kind is not None and wanted is not None and kind is not wanted:
            raise UsageError(
                f"subscription {args.subscription!r} is a {kind} subscription, not "
                f"--type {args.type} (leave --type out: it is read from the topic)"
            )
        queue = (kind or wanted or SubscriptionType.STREAM) is SubscriptionType.QUEUE
        cls = QueueConsumer if queue else StreamConsumer
        consumer = cls(
            target.service_url, args.namespace, args.topic, args.subscription, name, session=session
        )
        what = f"consumer {name} of {args.namespace}/{args.topic} subscription {args.subscription}"
        try:
            await _start(what, target.service_url, consumer.start())
            running = True
            async for message in consumer:
                if not args.quiet:
                    try:
                        out.write(format_message(message, args.output))
                        out.flush()
                    except BrokenPipeError:
                        stdout_gone()
                        break
                await consumer.ack(message)
                received += 1
                if args.count and received >= args.count:
                    break
        except asyncio.CancelledError:
            interrupted = True
            raise
        except (TopicNotFoundError, ConsumerError) as exc:
            raise sdk_error(exc, what) or exc from None
        finally:
            unregister = not args.keep_registration
            await _close(
                "consumer", lambda limit: consumer.close(unregister=unregister), interrupted
            )
            if running:
                print(
                    f"{'interrupted: ' if interrupted else ''}received {received} message(s)",
                    file=sys.stderr,
                )
    return 0


# -- bench ---------------------------------------------------------------------------------------


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


async def cmd_bench(args: argparse.Namespace) -> int:
    """Open-loop produce at ``--rate`` for ``--duration``; latency from the intended send time."""
    latencies: list[float] = []
    payload = b"x" * args.size
    keys = [f"bench-{i}" for i in range(args.keys)]
    total = max(1, int(args.rate * args.duration))
    futures: list[asyncio.Future[MessageId]] = []
    interrupted = False
    start = time.monotonic()
    async with _connected(args) as (session, target):
        producer = ScalableTopicProducer(
            target.service_url, args.namespace, args.topic, name=args.name, session=session
        )
        what = f"producer for {args.namespace}/{args.topic}"
        try:
            await _start(what, target.service_url, producer.start())
            start = time.monotonic()
            for i in range(total):
                intended = start + i / args.rate
                delay = intended - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                future = await producer.send_async(payload, key=keys[i % len(keys)])
                future.add_done_callback(_record_latency(latencies, intended))
                futures.append(future)
            if futures:
                await asyncio.wait(futures)
        except asyncio.CancelledError:
            interrupted = True
            raise
        finally:
            await _close("producer", lambda limit: producer.close(within=limit / 2), interrupted)
            if interrupted:
                print(
                    f"interrupted: {len(latencies)} of {len(futures)} message(s) acknowledged",
                    file=sys.stderr,
                )
    elapsed = time.monotonic() - start
    failed = sum(1 for f in futures if f.cancelled() or f.exception() is not None)
    latencies.sort()
    print(
        f"{total - failed} acknowledged, {failed} failed in {elapsed:.1f}s: "
        f"{(total - failed) / elapsed:,.0f} msg/s of {args.size} B"
    )
    print(
        "latency from intended send time: "
        + ", ".join(
            f"p{int(q * 1000) / 10:g} {_percentile(latencies, q) * 1000:.1f} ms"
            for q in (0.5, 0.99, 0.999)
        )
        + f", max {latencies[-1] * 1000 if latencies else math.nan:.1f} ms"
    )
    if failed:
        raise CliError(f"{failed} of {total} message(s) failed")
    return 0


def _record_latency(
    latencies: list[float], intended: float
) -> Callable[[asyncio.Future[Any]], None]:
    def done(future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            latencies.append(time.monotonic() - intended)

    return done


# -- parsers -------------------------------------------------------------------------------------


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    service = argparse.ArgumentParser(add_help=False, parents=[common])
    service.add_argument(
        "--service-url",
        metavar="URL",
        help="the operator's URL, e.g. http://scalable-topics-operator.scalable-topics:8080 "
        "(default: found from the topic's status.controller.url or the operator's Service)",
    )
    service.add_argument(
        "--operator-namespace",
        default=DEFAULT_OPERATOR_NAMESPACE,
        metavar="NS",
        help="namespace of the operator's Service, tried when status.controller.url does not "
        "answer (default: %(default)s)",
    )
    service.add_argument(
        "--token-file",
        metavar="PATH",
        help="ServiceAccount token (audience scalabletopics.io) to present, re-read when it "
        f"changes (default: ${TOKEN_FILE_ENV}, else the projected token at "
        "/var/run/secrets/scalabletopics.io/serviceaccount/token when present; docs/security.md)",
    )
    service.add_argument(
        "--ca-file",
        metavar="PATH",
        help="CA bundle verifying https/wss operator and brokers (default: "
        f"${CA_FILE_ENV}, else the system's CAs; docs/security.md)",
    )

    produce = sub.add_parser(
        "produce",
        parents=[service],
        help="send messages to a topic",
        description="Send --count generated messages ('message-<n>', keyed key-0, key-1, ...) "
        "or, with --stdin, one message per line of stdin ('key<TAB>value', or a bare value "
        "for an unkeyed message). A summary goes to stderr.",
    )
    produce.add_argument("topic", help="the ScalableTopic's name")
    produce.add_argument(
        "--name",
        default=None,
        help="producer name, the brokers' deduplication identity (default: a fresh one)",
    )
    produce.add_argument(
        "--stdin", action="store_true", help="send one message per line of stdin until EOF"
    )
    produce.add_argument(
        "--separator",
        default="\t",
        help="with --stdin: what separates the key from the value (default: TAB)",
    )
    produce.add_argument(
        "--verbose-ids",
        action="store_true",
        help="print '<key><TAB><segment>:<position>:<batch index>' for each acknowledged message",
    )
    produce.add_argument(
        "--count",
        type=cli_args.positive_int,
        default=None,
        help="how many messages to generate (default: 1000; not with --stdin)",
    )
    produce.add_argument(
        "--rate",
        type=cli_args.non_negative_float,
        default=0.0,
        help="messages per second (default: 0, as fast as possible)",
    )
    keys = produce.add_mutually_exclusive_group()
    keys.add_argument(
        "--keys",
        type=cli_args.positive_int,
        default=None,
        help="generated messages cycle over this many keys (default: 100)",
    )
    keys.add_argument(
        "--no-keys",
        action="store_true",
        help="generate unkeyed messages (round-robin over the active segments)",
    )
    produce.add_argument(
        "--key-prefix", default="key-", help="generated keys are <prefix><n> (default: key-)"
    )
    produce.add_argument(
        "--size",
        type=cli_args.non_negative_int,
        default=None,
        help="pad generated values with '.' to this many bytes (default: no padding)",
    )
    produce.set_defaults(afunc=cmd_produce, check=_check_produce)

    consume = sub.add_parser(
        "consume",
        parents=[service],
        help="read messages from a topic",
        description="Print the messages of a subscription, acknowledging each: "
        "'key<TAB>value' per line (an unkeyed message has an empty key), or one JSON object "
        "per line with -o json. Runs until --count messages or Ctrl-C; a summary goes to stderr.",
    )
    consume.add_argument("topic", help="the ScalableTopic's name")
    consume.add_argument(
        "--subscription", "-s", required=True, help="a subscription of the topic's spec"
    )
    consume.add_argument(
        "--name",
        default=None,
        help="consumer name, its identity with the controller (default: a fresh one)",
    )
    consume.add_argument(
        "--type",
        choices=tuple(TYPE_CHOICES),
        default=None,
        help="the subscription's type (default: read from the topic; stream with --service-url)",
    )
    consume.add_argument(
        "--count",
        type=cli_args.non_negative_int,
        default=0,
        help="stop after this many messages (default: 0, never)",
    )
    consume.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="text: 'key<TAB>value' lines (default); json: one object per line with segment, "
        "position, batchIndex, key, value, publishTime",
    )
    consume.add_argument("--quiet", "-q", action="store_true", help="count messages, print none")
    consume.add_argument(
        "--keep-registration",
        action="store_true",
        help="on exit, keep this name's segments for the subscription's grace period (a "
        "restart under the same --name gets them back) instead of handing them over at once",
    )
    consume.set_defaults(afunc=cmd_consume)

    bench = sub.add_parser("bench", parents=[service], help="open-loop produce benchmark")
    bench.add_argument("topic", help="the ScalableTopic's name")
    bench.add_argument("--name", default=None, help="producer name (default: a fresh one)")
    bench.add_argument(
        "--rate",
        type=cli_args.positive_float,
        default=5000.0,
        help="messages per second (default: %(default)g)",
    )
    bench.add_argument(
        "--duration",
        type=cli_args.positive_float,
        default=10.0,
        help="seconds to send for (default: %(default)g)",
    )
    bench.add_argument(
        "--size",
        type=cli_args.non_negative_int,
        default=100,
        help="value size in bytes (default: %(default)s)",
    )
    bench.add_argument(
        "--keys",
        type=cli_args.positive_int,
        default=1000,
        help="distinct keys, used in turn (default: %(default)s)",
    )
    bench.set_defaults(afunc=cmd_bench)
