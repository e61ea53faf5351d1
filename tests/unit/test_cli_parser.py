"""The ``stopic`` command line without a cluster: help text, argument checks, the exit-code
table and the ``consume`` output formats (``docs/client.md``, "CLI")."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from scalable_topics.cli import args as cli_args
from scalable_topics.cli.clients import format_message
from scalable_topics.cli.discovery import Target
from scalable_topics.cli.errors import CliError, NotFoundError, UnreachableError, UsageError
from scalable_topics.cli.main import build_parser, describe_error, main
from scalable_topics.client import ConsumerError, Message, TopicNotFoundError
from scalable_topics.core.subscriptions import SubscriptionType
from scalable_topics.kubeapi import KubeconfigError

TOPIC_COMMANDS = (
    "dag",
    "split",
    "merge",
    "move",
    "drain",
    "uncordon",
    "produce",
    "consume",
    "bench",
)


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]  # type: ignore[no-any-return]
    raise AssertionError("no subcommands")


@pytest.mark.parametrize("name", TOPIC_COMMANDS)
def test_every_option_has_help(name: str) -> None:
    for action in subcommand(name)._actions:
        assert action.help, f"stopic {name} {'/'.join(action.option_strings) or action.dest}"


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["split", "t", "0", "--at", "zzzz"], "argument --at: 'zzzz' is not a hash point"),
        (["split", "t", "0", "--at", "10000"], "is not a hash point"),
        (["split", "t", "-1"], "argument segment: must be 0 or more, got -1"),
        (["produce", "t", "--keys", "0"], "argument --keys: must be at least 1, got 0"),
        (["produce", "t", "--count", "-5"], "argument --count: must be at least 1, got -5"),
        (["produce", "t", "--keys", "3", "--no-keys"], "not allowed with argument --keys"),
        (["produce", "t", "--stdin", "--size", "3"], "--size: only for generated messages"),
        (["bench", "t", "--keys", "0"], "argument --keys: must be at least 1"),
        (["bench", "t", "--rate", "0"], "argument --rate: must be more than 0"),
        (["bench", "t", "--duration", "nan"], "is not a finite number"),
        (["dag", "t", "--interval", "0"], "argument --interval: must be more than 0"),
        (["merge", "t", "1"], "a merge needs two or more adjacent active segments"),
        (["merge", "t", "2", "2"], "each segment can be named once"),
        (["move", "t", "0"], "the following arguments are required: --to"),
        (["move", "t", "-1", "--to", "b"], "argument segment: must be 0 or more, got -1"),
        (["drain"], "the following arguments are required: pod"),
        (["drain", "p", "--timeout", "0"], "argument --timeout: must be more than 0"),
        (["consume", "t", "-s", "b", "-o", "yaml"], "argument -o/--output: invalid choice"),
        (
            ["consume", "t", "-s", "b", "--type", "Queue"],
            "argument --type: invalid choice: 'Queue' (choose from 'stream', 'queue')",
        ),
    ],
)
def test_a_wrong_argument_is_one_line_and_exit_2(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert complaint in err
    assert err.startswith(f"stopic {argv[0]}: error: ")


def test_a_subscription_type_is_read_from_the_topic_spec_as_the_core_enum() -> None:
    topic = {
        "metadata": {"namespace": "ns", "name": "t"},
        "spec": {"subscriptions": [{"name": "audit", "type": "Queue"}, {"name": "feed"}]},
    }
    target = Target("http://operator", topic)
    assert target.subscription_type("audit") is SubscriptionType.QUEUE
    assert target.subscription_type("feed") is SubscriptionType.STREAM, "Stream by default"
    assert Target("http://operator").subscription_type("audit") is None, "topic not read"
    with pytest.raises(NotFoundError) as missing:
        target.subscription_type("other")
    assert str(missing.value) == (
        "subscription 'other' not found on scalabletopic ns/t "
        "(its subscriptions: audit (Queue), feed (Stream))"
    )


def test_hash_points() -> None:
    assert [cli_args.hash_point(t) for t in ("4000", "0x4000", "ffff", "0", "A")] == [
        0x4000,
        0x4000,
        0xFFFF,
        0,
        10,
    ]


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (CliError("split rejected: x"), 1, "split rejected: x"),
        (UsageError("u"), 2, "u"),
        (NotFoundError("n"), 3, "n"),
        (UnreachableError("r"), 4, "r"),
        (KubeconfigError("no usable kubeconfig"), 2, "no usable kubeconfig"),
        (TopicNotFoundError("gone"), 3, "the topic: gone"),
        (ConsumerError("InvalidSubscription", "no such"), 3, "InvalidSubscription: no such"),
        (ConsumerError("Superseded", "elsewhere"), 1, "Superseded: elsewhere"),
        (ConnectionResetError("reset"), 4, "connection failed: reset"),
        (ValueError("odd\nvalue"), 1, "unexpected ValueError: odd value (--verbose shows"),
    ],
)
def test_the_exit_code_table(error: BaseException, code: int, line: str) -> None:
    got_code, got_line = describe_error(error)
    assert got_code == code
    assert line in got_line and "\n" not in got_line


def message(key: str | None, value: bytes) -> Message:
    return Message(
        key=key,
        value=value,
        segment_id=3,
        position=41,
        batch_index=2,
        publish_time_ms=1_764_040_000_123,
    )


def test_text_output_is_key_tab_value() -> None:
    assert format_message(message("customer-7", b"total 12"), "text") == b"customer-7\ttotal 12\n"
    assert format_message(message(None, b"ping"), "text") == b"\tping\n"
    raw_key = b"k\xff".decode("utf-8", "surrogateescape")
    assert format_message(message(raw_key, b"\x00\x01"), "text") == b"k\xff\t\x00\x01\n"


def test_json_output_is_one_object_per_line() -> None:
    line = format_message(message("customer-7", "grüße".encode()), "json")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {
        "segment": 3,
        "position": 41,
        "batchIndex": 2,
        "key": "customer-7",
        "value": "grüße",
        "publishTime": "2025-11-25T03:06:40.123Z",
    }
    raw_key = b"k\xff".decode("utf-8", "surrogateescape")
    binary = json.loads(format_message(message(raw_key, b"\xff\x00"), "json"))
    assert binary["keyBase64"] == "a/8=" and binary["valueBase64"] == "/wA="
    assert "key" not in binary and "value" not in binary
    assert json.loads(format_message(message(None, b"v"), "json"))["key"] is None


def test_drain_waits_for_the_segments_on_the_pod_or_moving_from_it() -> None:
    from scalable_topics.cli.drain import segments_on

    segments: list[dict[str, Any]] = [
        {"metadata": {"namespace": "a", "name": "t-0"}, "status": {"broker": {"pod": "b-0"}}},
        {"metadata": {"namespace": "a", "name": "t-1"}, "status": {"broker": {"pod": "b-1"}}},
        {
            "metadata": {
                "namespace": "b",
                "name": "u-3",
                "annotations": {"scalabletopics.io/broker": "b-0"},
            }
        },
    ]
    assert segments_on("b-0", segments) == ["a/t-0", "b/u-3"]
    assert segments_on("b-2", segments) == []
    committed = {
        "metadata": {"namespace": "a", "name": "t-2"},
        "status": {
            "broker": {"pod": "b-1"},
            "transfer": {"phase": "Owned", "source": {"pod": "b-2"}, "destination": {"pod": "b-1"}},
        },
    }
    assert segments_on("b-2", [*segments, committed]) == ["a/t-2"], (
        "the source deletes its copy only at the release after the Owned commit"
    )
    released = {"metadata": committed["metadata"], "status": {"broker": {"pod": "b-1"}}}
    assert segments_on("b-2", [*segments, released]) == []
