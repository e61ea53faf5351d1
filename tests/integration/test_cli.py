"""``stopic`` as a user runs it: the installed console script, as a subprocess, against the
embedded control plane with the real operator and brokers (``operator_harness``), with
``KUBECONFIG`` set and never ``--service-url``.

Keyed and unkeyed produce → consume on Stream and Queue subscriptions, ``-o json``, split and
merge, every ordinary mistake (exit code, exactly one line on stderr, no traceback, no
"Unclosed client session"), Ctrl-C (SIGINT) in each command's running states, and what
``kubectl get seg`` / ``kubectl describe stopic`` show. One stack per module.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from .operator_harness import JsonObj, Stack, eventually, operator_stack, topic_body

pytestmark = pytest.mark.asyncio(loop_scope="module")

STOPIC = str(Path(sys.executable).with_name("stopic"))
SUBSCRIPTIONS = [
    {"name": "billing", "type": "Stream"},
    {"name": "audit", "type": "Queue"},
    {"name": "export", "type": "Stream"},
]
SIGINT_BOUND = 8.0
"""Seconds from Ctrl-C to the end of the process that the test allows. The commands cap their
close at ``cli.clients.INTERRUPTED_CLOSE`` (1.2 s) after Ctrl-C, against ``CLOSE_TIMEOUT``
(10 s) after a normal end and 30 s or more for the SDK's network timeouts: a command that waits
on any of those fails here, while a loaded CI machine (``make test`` runs four workers on two
cores; 7.6 s was seen at load 20) does not. How fast Ctrl-C is on a quiet machine is
``bench``'s to measure, not a test's."""


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    def error_line(self) -> str:
        """The one line a failure prints (asserting that it is one, without a traceback)."""
        lines = self.stderr.strip().splitlines()
        assert len(lines) == 1, self.stderr
        assert "Traceback" not in self.stderr and "Unclosed" not in self.stderr, self.stderr
        return lines[0]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(
        tmp_path_factory.mktemp("cli"), operator_replicas=1, brokers=2
    ) as running:
        yield running


def user_env(stack: Stack, **extra: str) -> dict[str, str]:
    """A user's shell: KUBECONFIG names the cluster; HOME has no ~/.kube/config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(KUBECONFIG=str(stack.cluster.kubeconfig), HOME=str(stack.data_dir), **extra)
    return env


async def start(
    stack: Stack, *args: str, stdin: bool = False, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        STOPIC,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env or user_env(stack),
    )


async def stopic(
    stack: Stack,
    *args: str,
    input: str | None = None,
    env: dict[str, str] | None = None,
    within: float = 90,
) -> Run:
    proc = await start(stack, *args, stdin=input is not None, env=env)
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(input.encode() if input is not None else None), within
        )
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return Run(proc.returncode or 0, out.decode(), err.decode())


async def new_topic(stack: Stack, name: str, segments: int = 2) -> JsonObj:
    await stack.apply_topic(topic_body(name, segments=segments, subscriptions=SUBSCRIPTIONS))
    return await stack.wait_ready(name)


async def interrupt(proc: asyncio.subprocess.Process) -> tuple[float, str]:
    """Ctrl-C: SIGINT, then how long the process took to end and its stderr."""
    assert proc.returncode is None, "the command ended before Ctrl-C"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.stderr is not None
    err, _ = await asyncio.gather(proc.stderr.read(), asyncio.wait_for(proc.wait(), 10))
    return time.monotonic() - sent, err.decode()


def assert_interrupted(proc: asyncio.subprocess.Process, took: float, err: str) -> None:
    assert proc.returncode == 130, (proc.returncode, err)
    assert took < SIGINT_BOUND, f"Ctrl-C took {took:.2f}s"
    assert "Traceback" not in err and "Unclosed" not in err, err


async def registered(stack: Stack, topic: str, subscription: str, consumer: str) -> bool:
    obj = await stack.topic(topic)
    for sub in ((obj or {}).get("status") or {}).get("subscriptions") or []:
        if sub.get("name") == subscription:
            return any(c.get("name") == consumer for c in sub.get("consumers") or [])
    return False


def by_key(pairs: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for key, value in pairs:
        found.setdefault(key, []).append(value)
    return found


# -- produce → consume ---------------------------------------------------------------------------


@dataclass
class RoundTrip:
    produced: list[tuple[str, str]]
    """(key, value) of every message, in send order; key "" is an unkeyed message."""
    runs: list[Run]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def roundtrip(stack: Stack) -> RoundTrip:
    """Topic ``roundtrip``: keyed and unkeyed lines from stdin, then generated keyed and
    unkeyed messages, all sent with ``stopic produce`` and no ``--service-url``."""
    await new_topic(stack, "roundtrip")
    lines = [(f"customer-{i % 4}", f"order {i}") for i in range(12)]
    lines += [("", f"heartbeat {i}") for i in range(4)]
    text = "".join(f"{k}\t{v}\n" if k else f"{v}\n" for k, v in lines)
    runs = [
        await stopic(stack, "produce", "roundtrip", "--stdin", "--verbose-ids", input=text),
        await stopic(stack, "produce", "roundtrip", "--count", "6", "--keys", "3"),
        await stopic(stack, "produce", "roundtrip", "--count", "3", "--no-keys"),
    ]
    generated = [(f"key-{i % 3}", f"message-{i}") for i in range(6)]
    unkeyed = [("", f"message-{i}") for i in range(3)]
    return RoundTrip(lines + generated + unkeyed, runs)


async def test_produce_keyed_and_unkeyed_without_service_url(roundtrip: RoundTrip) -> None:
    from_stdin, keyed, bare = roundtrip.runs
    for run, count in ((from_stdin, 16), (keyed, 6), (bare, 3)):
        assert run.returncode == 0, run.stderr
        assert run.stderr.splitlines()[-1].startswith(f"sent {count} message(s) in "), run
        assert "Traceback" not in run.stderr and "Unclosed" not in run.stderr, run.stderr
    ids = [line.split("\t") for line in from_stdin.stdout.splitlines()]
    assert sorted(k for k, _ in ids) == sorted(k for k, _ in roundtrip.produced[:16])
    assert all(len(i.split(":")) == 3 for _, i in ids), ids
    assert keyed.stdout == bare.stdout == ""


@pytest.mark.parametrize("subscription", ["billing", "audit"])
async def test_consume_prints_key_tab_value_in_key_order(
    stack: Stack, roundtrip: RoundTrip, subscription: str
) -> None:
    """Stream and Queue (the type is read from the topic); each key's messages in order."""
    produced = roundtrip.produced
    run = await stopic(
        stack, "consume", "roundtrip", "-s", subscription, "--count", str(len(produced))
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines()[-1] == f"received {len(produced)} message(s)", run.stderr
    assert "Traceback" not in run.stderr and "Unclosed" not in run.stderr, run.stderr
    got = [tuple(line.split("\t", 1)) for line in run.stdout.splitlines()]
    assert all(len(pair) == 2 for pair in got), run.stdout
    assert sorted(got) == sorted(produced)
    expected = by_key(produced)
    for key, values in by_key(got).items():  # type: ignore[arg-type]
        if key:
            assert values == expected[key], key


async def test_consume_json_output(stack: Stack, roundtrip: RoundTrip) -> None:
    produced = roundtrip.produced
    run = await stopic(
        stack, "consume", "roundtrip", "-s", "export", "-o", "json", "--count", str(len(produced))
    )
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in run.stdout.splitlines()]
    assert sorted((r["key"] or "", r["value"]) for r in records) == sorted(produced)
    for record in records:
        assert {"segment", "position", "batchIndex", "key", "value", "publishTime"} <= set(record)
        assert record["segment"] in (0, 1) and record["position"] >= 0
        assert record["publishTime"].endswith("Z")
    assert any(r["key"] is None for r in records)


async def test_backlog_in_segment_status_and_dag(stack: Stack) -> None:
    """The owning broker writes ``Segment.status.backlog`` (entries not acknowledged, per
    subscription) and ``stopic dag`` shows it; consuming one subscription brings its count to
    0 and leaves the others."""
    name = "backlog"
    await new_topic(stack, name, segments=1)
    sent = await stopic(stack, "produce", name, "--count", "6", "--keys", "3")
    assert sent.returncode == 0, sent.stderr
    url = (await stack.broker_segments(name))[0]
    stats = await stack.segment_stats(url, name, 0)
    assert stats is not None
    entries = int(stats["nextPosition"]) - int(stats["firstPosition"])
    assert entries > 0, stats
    unread = {sub["name"]: entries for sub in SUBSCRIPTIONS}

    async def backlog_is(wanted: dict[str, int]) -> bool:
        status = (await stack.segments(name))[0].get("status") or {}
        return status.get("backlog") == wanted

    await eventually(lambda: backlog_is(unread), 30, f"status.backlog {unread}")
    dag = await stopic(stack, "dag", name, within=30)
    assert dag.returncode == 0, dag.stderr
    assert f"backlog {3 * entries})" in dag.stdout, dag.stdout

    consumed = await stopic(stack, "consume", name, "-s", "billing", "--count", "6")
    assert consumed.returncode == 0, consumed.stderr
    read = {**unread, "billing": 0}
    await eventually(lambda: backlog_is(read), 30, f"status.backlog {read}")
    dag = await stopic(stack, "dag", name, within=30)
    assert f"backlog {2 * entries})" in dag.stdout, dag.stdout

    # A subscription removed from the spec goes from the broker, and from status.backlog.
    kept = [sub for sub in SUBSCRIPTIONS if sub["name"] != "export"]
    await stack.apply_topic(topic_body(name, segments=1, subscriptions=kept))
    left = {"billing": 0, "audit": entries}
    await eventually(lambda: backlog_is(left), 30, f"status.backlog {left}")


# -- split and merge -----------------------------------------------------------------------------


async def test_split_and_merge_report_the_outcome(stack: Stack) -> None:
    await new_topic(stack, "ops")
    split = await stopic(stack, "split", "ops", "0", "--at", "2000")
    assert split.returncode == 0, split.stderr
    assert split.stdout.startswith("Succeeded: split #0 into #2 0000-2000, #3 2001-7fff")
    merge = await stopic(stack, "merge", "ops", "2", "3")
    assert merge.returncode == 0, merge.stderr
    assert "merged #2, #3 into #4 0000-7fff" in merge.stdout
    again = await stopic(stack, "split", "ops", "0")
    assert again.returncode == 1
    assert again.stderr.strip().endswith(
        "stopic: split rejected: cannot split segment 0000-7fff-0: it is SEALED, not ACTIVE"
    ), again.stderr
    assert "done" not in again.stderr and "Traceback" not in again.stderr


async def test_merge_of_one_segment_is_a_usage_error_and_requests_nothing(stack: Stack) -> None:
    await new_topic(stack, "one-merge")
    run = await stopic(stack, "merge", "one-merge", "1")
    assert run.returncode == 2
    assert "a merge needs two or more adjacent active segments" in run.error_line()
    topic = await stack.topic("one-merge")
    assert "scalabletopics.io/request" not in (topic or {})["metadata"].get("annotations", {})


async def test_a_hand_written_one_segment_merge_is_rejected_as_a_merge(stack: Stack) -> None:
    """The operator recorded such a rejected merge with op "split"."""
    await new_topic(stack, "hand-merge")
    await stack.request("hand-merge", {"id": "m-1", "op": "merge", "segments": [1]})
    topic = await stack.wait_request("hand-merge", "m-1")
    last = topic["status"]["lastRequest"]
    assert (last["op"], last["result"]) == ("merge", "Rejected"), last


# -- mistakes ------------------------------------------------------------------------------------


@dataclass
class Silent:
    """A port that accepts connections and never answers (a server that hangs)."""

    port: int
    held: list[asyncio.StreamWriter]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def silent() -> AsyncIterator[Silent]:
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    yield Silent(int(server.sockets[0].getsockname()[1]), held)
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


def kubeconfig_at(stack: Stack, server: str, name: str) -> str:
    text = stack.cluster.kubeconfig.read_text()
    lines = [
        line.split("server:")[0] + f"server: {server}" if "server:" in line else line
        for line in text.splitlines()
    ]
    path = stack.data_dir / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


MISTAKES = [
    pytest.param(
        ["consume", "nope", "-s", "billing"],
        3,
        "scalabletopic default/nope not found",
        id="missing topic",
    ),
    pytest.param(
        ["consume", "roundtrip", "-s", "nope"],
        3,
        "subscription 'nope' not found",
        id="missing subscription",
    ),
    pytest.param(
        ["produce", "nope"], 3, "scalabletopic default/nope not found", id="missing topic (produce)"
    ),
    pytest.param(
        ["dag", "nope"], 3, "scalabletopic default/nope not found", id="missing topic (dag)"
    ),
    pytest.param(
        ["split", "nope", "0"],
        3,
        "scalabletopic default/nope not found",
        id="missing topic (split)",
    ),
    pytest.param(
        ["split", "roundtrip", "9"], 3, "segment 9 is not in the DAG", id="missing segment"
    ),
    pytest.param(
        ["consume", "roundtrip", "-s", "audit", "--type", "stream"],
        2,
        "is a Queue subscription",
        id="wrong --type",
    ),
    pytest.param(
        ["split", "roundtrip", "0", "--at", "zzzz"], 2, "argument --at", id="split --at zzzz"
    ),
    pytest.param(
        ["produce", "roundtrip", "--keys", "0"],
        2,
        "argument --keys: must be at least 1",
        id="produce --keys 0",
    ),
    pytest.param(
        ["bench", "roundtrip", "--keys", "0"],
        2,
        "argument --keys: must be at least 1",
        id="bench --keys 0",
    ),
    pytest.param(
        ["produce", "roundtrip", "--count", "-5"],
        2,
        "argument --count: must be at least 1",
        id="produce --count -5",
    ),
    pytest.param(
        ["produce", "roundtrip", "--rate", "-1"], 2, "argument --rate", id="produce --rate -1"
    ),
    pytest.param(
        ["consume", "roundtrip", "-s", "billing", "--count", "x"],
        2,
        "not a whole number",
        id="consume --count x",
    ),
    pytest.param(["merge", "roundtrip", "1"], 2, "two or more", id="merge of one"),
    pytest.param(
        ["produce", "roundtrip", "--stdin", "--count", "3"],
        2,
        "not with --stdin",
        id="stdin with --count",
    ),
    pytest.param(
        ["produce", "roundtrip", "--service-url", "http://127.0.0.1:1"],
        4,
        "connection refused",
        id="unreachable --service-url",
    ),
]


@pytest.mark.parametrize(("args", "code", "says"), MISTAKES)
async def test_a_mistake_is_one_line_and_an_exit_code(
    stack: Stack, roundtrip: RoundTrip, args: list[str], code: int, says: str
) -> None:
    run = await stopic(stack, *args, within=30)
    assert run.returncode == code, (run.returncode, run.stderr)
    assert says in run.error_line()
    assert run.stdout == ""


async def test_arguments_are_checked_before_connecting(
    stack: Stack, roundtrip: RoundTrip, silent: Silent
) -> None:
    """With an API server that never answers, a wrong argument still fails at once: the
    command ends with a usage error without ever connecting to it."""
    hanging = kubeconfig_at(stack, f"http://127.0.0.1:{silent.port}", "hanging.kubeconfig")
    for args in (
        ["split", "roundtrip", "0", "--at", "zzzz"],
        ["produce", "roundtrip", "--keys", "0"],
    ):
        connections = len(silent.held)
        run = await stopic(stack, *args, "--kubeconfig", hanging, within=30)
        assert run.returncode == 2, run.stderr
        run.error_line()
        assert len(silent.held) == connections, f"{args} connected to the API server first"


async def test_cluster_problems_are_one_line(
    stack: Stack, roundtrip: RoundTrip, silent: Silent
) -> None:
    refused = kubeconfig_at(stack, "http://127.0.0.1:1", "refused.kubeconfig")
    hanging = kubeconfig_at(stack, f"http://127.0.0.1:{silent.port}", "hanging.kubeconfig")
    silent_url = f"http://127.0.0.1:{silent.port}"
    broken = stack.data_dir / "broken.kubeconfig"
    broken.write_text("clusters: [\n")
    missing = stack.data_dir / "missing.kubeconfig"
    cases = [
        (["dag", "roundtrip", "--kubeconfig", refused], 4, "connection refused"),
        (["consume", "roundtrip", "-s", "billing", "--kubeconfig", refused], 4, "refused"),
        (
            ["dag", "roundtrip", "--kubeconfig", hanging, "--request-timeout", "1"],
            4,
            "did not answer within 1s",
        ),
        (["dag", "roundtrip", "--kubeconfig", str(missing)], 2, f"{missing}: no such file"),
        (["produce", "roundtrip", "--kubeconfig", str(broken)], 2, "is not valid YAML"),
        (["consume", "roundtrip", "-s", "b", "--service-url", silent_url], 4, "no answer in"),
    ]
    for args, code, says in cases:
        run = await stopic(stack, *args, within=30)
        assert run.returncode == code, (args, run.stderr)
        assert says in run.error_line(), (args, run.stderr)
    env = user_env(stack)
    del env["KUBECONFIG"]
    run = await stopic(stack, "dag", "roundtrip", env=env, within=30)
    assert run.returncode == 2
    assert "no kubeconfig" in run.error_line()


async def test_verbose_shows_the_traceback(stack: Stack) -> None:
    run = await stopic(stack, "dag", "nope", "--verbose", within=30)
    assert run.returncode == 3
    assert "Traceback" in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("stopic: scalabletopic default/nope")


# -- Ctrl-C --------------------------------------------------------------------------------------


async def test_ctrl_c_ends_a_consumer_that_is_printing(stack: Stack) -> None:
    await new_topic(stack, "busy")
    run = await stopic(stack, "produce", "busy", "--count", "500", "--keys", "50")
    assert run.returncode == 0, run.stderr
    proc = await start(stack, "consume", "busy", "-s", "billing")
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert first.startswith(b"key-"), first
    took, err = await interrupt(proc)
    assert_interrupted(proc, took, err)
    assert err.strip().startswith("interrupted: received"), err


async def test_ctrl_c_ends_an_idle_consumer(stack: Stack) -> None:
    await new_topic(stack, "idle")
    proc = await start(stack, "consume", "idle", "-s", "audit", "--name", "idler")
    await eventually(lambda: registered(stack, "idle", "audit", "idler"), 60, "idler registered")
    took, err = await interrupt(proc)
    assert_interrupted(proc, took, err)


async def test_ctrl_c_ends_a_producer_reading_stdin(stack: Stack) -> None:
    await new_topic(stack, "typing")
    proc = await start(stack, "produce", "typing", "--stdin", "--verbose-ids", stdin=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"k\tfirst\n")
    await proc.stdin.drain()
    acked = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert acked.startswith(b"k\t"), acked
    took, err = await interrupt(proc)  # waiting on stdin, which stays open
    assert_interrupted(proc, took, err)
    assert "1 of 1 message(s) acknowledged" in err, err


async def test_ctrl_c_ends_a_producer_sending(stack: Stack) -> None:
    await new_topic(stack, "sending")
    proc = await start(
        stack, "produce", "sending", "--count", "1000000", "--rate", "500", "--verbose-ids"
    )
    assert proc.stdout is not None
    await asyncio.wait_for(proc.stdout.readline(), 60)
    took, err = await interrupt(proc)
    assert_interrupted(proc, took, err)


async def test_ctrl_c_ends_a_command_waiting_for_the_api(stack: Stack, silent: Silent) -> None:
    hanging = kubeconfig_at(stack, f"http://127.0.0.1:{silent.port}", "hanging.kubeconfig")
    before = len(silent.held)
    proc = await start(
        stack, "produce", "roundtrip", "--kubeconfig", hanging, "--request-timeout", "60"
    )

    async def connected() -> bool:
        return len(silent.held) > before

    await eventually(connected, 60, "stopic connected to the API server")
    took, err = await interrupt(proc)
    assert_interrupted(proc, took, err)
    assert err == "", err


async def test_bench_reports_rate_and_latency(stack: Stack) -> None:
    await new_topic(stack, "bench")
    run = await stopic(stack, "bench", "bench", "--rate", "200", "--duration", "1", "--keys", "5")
    assert run.returncode == 0, run.stderr
    acked, latency = run.stdout.splitlines()
    assert acked.startswith("200 acknowledged, 0 failed in "), acked
    assert latency.startswith("latency from intended send time: p50 "), latency


async def test_ctrl_c_ends_dag_watch(stack: Stack, roundtrip: RoundTrip) -> None:
    proc = await start(stack, "dag", "roundtrip", "--watch", "--interval", "0.2")
    assert proc.stdout is not None
    await asyncio.wait_for(proc.stdout.readline(), 60)
    took, err = await interrupt(proc)
    assert_interrupted(proc, took, err)


async def test_dag_watch_into_a_closed_pipe_ends_quietly(stack: Stack) -> None:
    """`stopic dag TOPIC --watch | head -3`: at its next redraw after the reader has gone the
    command ends with status 0 and says nothing (it used to report "connection failed: Broken
    pipe"). Like `kubectl get -w | head`, it notices at its next write: a split makes one."""
    await new_topic(stack, "piped")
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        f"{STOPIC} dag piped --watch --interval 0.2 | head -3; exit ${{PIPESTATUS[0]}}",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=user_env(stack),
    )
    assert proc.stdout is not None
    shown = [await asyncio.wait_for(proc.stdout.readline(), 60) for _ in range(3)]
    assert shown[1].decode().startswith("default/piped:"), shown
    split = await stopic(stack, "split", "piped", "0")
    assert split.returncode == 0, split.stderr
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, (proc.returncode, err)
    assert err.decode() == ""
    assert out == b""


# -- kubectl output ------------------------------------------------------------------------------


async def test_kubectl_shows_whole_rates_and_no_sealed_at_epoch_for_active_segments(
    stack: Stack,
) -> None:
    await new_topic(stack, "shown")

    async def first_load_report() -> bool:
        # The placement records the zero load: a patch before it would be overwritten.
        segment = (await stack.segments("shown")).get(0) or {}
        return bool((segment.get("status") or {}).get("load"))

    await eventually(first_load_report, 60, "the zero load recorded with shown-0's placement")
    await stack.kubectl(
        "patch", "seg", "shown-0", "--subresource=status", "--type=merge",
        "-p", '{"status": {"load": {"msgRateIn": 71.71031059119261}}}',
    )  # fmt: skip
    table = await stack.kubectl("get", "seg", "shown-0", "--no-headers")
    assert table.stdout.split()[6] == "71", table.stdout
    described = (await stack.kubectl("describe", "stopic", "shown")).stdout
    assert "Sealed At Epoch" not in described, described
    split = await stopic(stack, "split", "shown", "0")
    assert split.returncode == 0, split.stderr
    described = (await stack.kubectl("describe", "stopic", "shown")).stdout
    assert described.count("Sealed At Epoch:") == 1, described


# -- without an operator (last in the module: the operator stays scaled to zero) -----------------


async def test_without_a_running_operator(stack: Stack, roundtrip: RoundTrip) -> None:
    await stack.scale_operator(0)
    run = await stopic(stack, "produce", "roundtrip", within=60)
    assert run.returncode == 4, run.stderr
    line = run.error_line()
    assert line.startswith("stopic: cannot reach the operator for default/roundtrip: tried "), line
    assert "Service scalable-topics/scalable-topics-operator http://" in line, line
    assert line.endswith("pass --service-url URL (the operator's address as seen from here)")

    late = await stopic(stack, "merge", "roundtrip", "0", "1", "--timeout", "1")
    assert late.returncode == 1
    assert late.stderr.splitlines()[-1].startswith("stopic: no outcome for request cli-")

    proc = await start(stack, "split", "roundtrip", "1")
    assert proc.stderr is not None
    waiting = await asyncio.wait_for(proc.stderr.readline(), 60)
    assert waiting.startswith(b"split [1] on default/roundtrip"), waiting
    took, err = await interrupt(proc)
    assert_interrupted(proc, took, err)
    assert "stays on the topic and may still run" in err, err
