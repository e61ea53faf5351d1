"""The pure half of authentication and authorization (core.auth) and the client's token file
(credentials): review bodies and answers, the bounded TTL cache, the messages a refused client
gets, and a rotated token reaching the next request."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from aiohttp import web

from scalable_topics.core import auth
from scalable_topics.credentials import CredentialsError, TokenFile, client_session, token_file


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cache_entries_expire_after_the_ttl() -> None:
    clock = FakeClock()
    cache: auth.TTLCache[str, int] = auth.TTLCache(10.0, 8, clock=clock)
    cache.put("a", 1)
    clock.now += 9.9
    assert cache.get("a") == 1
    clock.now += 0.1
    assert cache.get("a") is None
    assert len(cache) == 0


def test_cache_is_bounded_and_evicts_the_least_recently_used() -> None:
    cache: auth.TTLCache[int, int] = auth.TTLCache(60.0, 3, clock=FakeClock())
    for i in range(3):
        cache.put(i, i)
    assert cache.get(0) == 0  # 1 is now the least recently used
    for i in range(3, 100):
        cache.put(i, i)
        assert len(cache) == 3
    assert cache.get(1) is None
    assert [cache.get(i) for i in (97, 98, 99)] == [97, 98, 99]
    with pytest.raises(ValueError):
        auth.TTLCache(1.0, 0)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc.def", "abc.def"),
        ("bearer   abc ", "abc"),
        ("Basic dXNlcjpwYXNz", ""),
        ("Bearer", ""),
        ("", ""),
        (None, ""),
    ],
)
def test_bearer_token(header: str | None, token: str) -> None:
    assert auth.bearer_token(header) == token


def _review(**status: object) -> dict[str, object]:
    return {"status": status}


def test_an_authenticated_review_gives_the_identity() -> None:
    review = _review(
        authenticated=True,
        audiences=[auth.AUDIENCE],
        user={
            "username": "system:serviceaccount:apps:writer",
            "uid": "u-1",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:apps"],
            "extra": {"authentication.kubernetes.io/pod-name": ["writer-0"]},
        },
    )
    identity = auth.identity_from_review(review, (auth.AUDIENCE,))
    assert identity == auth.Identity(
        "system:serviceaccount:apps:writer",
        "u-1",
        ("system:serviceaccounts", "system:serviceaccounts:apps"),
        (("authentication.kubernetes.io/pod-name", ("writer-0",)),),
    )
    body = auth.access_review(identity, auth.VERB_PRODUCE, "apps", "orders")
    assert body["spec"] == {
        "user": "system:serviceaccount:apps:writer",
        "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:apps"],
        "extra": {"authentication.kubernetes.io/pod-name": ["writer-0"]},
        "resourceAttributes": {
            "group": "scalabletopics.io",
            "resource": "scalabletopics",
            "verb": "produce",
            "namespace": "apps",
            "name": "orders",
        },
    }
    assert auth.token_review("t", (auth.AUDIENCE,))["spec"] == {
        "token": "t",
        "audiences": ["scalabletopics.io"],
    }


def test_a_refused_or_other_audience_token_is_unauthenticated() -> None:
    with pytest.raises(auth.AccessDenied) as refused:
        auth.identity_from_review(
            _review(authenticated=False, error="token has expired"), (auth.AUDIENCE,)
        )
    assert refused.value.code == auth.ERR_UNAUTHENTICATED
    assert refused.value.status == 401
    assert refused.value.close_code == auth.CLOSE_UNAUTHENTICATED
    assert "token has expired" in str(refused.value)
    with pytest.raises(auth.AccessDenied) as other:
        auth.identity_from_review(
            _review(authenticated=True, audiences=["https://kubernetes.default.svc"], user={}),
            (auth.AUDIENCE,),
        )
    assert "audience 'scalabletopics.io'" in str(other.value)


def test_a_forbidden_message_names_the_missing_permission() -> None:
    who = auth.Identity("system:serviceaccount:apps:reader")
    denied = auth.forbidden(who, auth.VERB_PRODUCE, "apps", "orders")
    assert denied.status == 403 and denied.close_code == auth.CLOSE_FORBIDDEN
    text = str(denied)
    for part in (
        "system:serviceaccount:apps:reader may not produce topic apps/orders",
        'verb "produce" on scalabletopics.scalabletopics.io "orders" in namespace "apps"',
        "scalable-topics-producer",
    ):
        assert part in text
    assert auth.decision_of({"status": {"allowed": True}}) == (True, "")
    assert auth.decision_of({"status": {"allowed": True, "denied": True}})[0] is False
    assert auth.decision_of({"status": {"allowed": False, "reason": "no"}}) == (False, "no")


def test_token_file_is_reread_when_rotated(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    tokens = TokenFile(path)
    assert tokens.header() == "Bearer one"
    assert tokens.token() == "one" and tokens.reads == 1
    # The kubelet swaps the file atomically (a new inode).
    fresh = tmp_path / "token.new"
    fresh.write_text("two")
    os.replace(fresh, path)
    assert tokens.token() == "two" and tokens.reads == 2
    path.unlink()
    with pytest.raises(CredentialsError, match=r"token file .*token"):
        tokens.token()


def test_token_file_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCALABLE_TOPICS_TOKEN_FILE", raising=False)
    assert token_file() is None or Path("/var/run/secrets/scalabletopics.io").exists()
    monkeypatch.setenv("SCALABLE_TOPICS_TOKEN_FILE", str(tmp_path / "env"))
    found = token_file()
    assert found is not None and found.path == tmp_path / "env"
    given = token_file(tmp_path / "given")
    assert given is not None and given.path == tmp_path / "given"


async def test_client_session_presents_the_current_token(tmp_path: Path) -> None:
    seen: list[str | None] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    path = tmp_path / "token"
    path.write_text("first")
    try:
        async with client_session(path) as session:
            async with session.get(f"http://127.0.0.1:{port}/") as response:
                assert response.status == 200
            fresh = tmp_path / "rotated"
            fresh.write_text("second")
            os.replace(fresh, path)
            async with session.get(f"http://127.0.0.1:{port}/") as response:
                assert response.status == 200
    finally:
        await runner.cleanup()
    assert seen == ["Bearer first", "Bearer second"]


async def test_an_unreachable_api_server_refuses_with_auth_unavailable(tmp_path: Path) -> None:
    """Fail closed: no API server to ask means 503 / close 1013, and nothing is cached."""
    from scalable_topics.client.segment import AccessDeniedError, SegmentError, SegmentProducer
    from scalable_topics.kubeauth import KubernetesAuth
    from segment_broker.access import BrokerAccess
    from segment_broker.config import BrokerConfig
    from segment_broker.server import Broker
    from segment_broker.testing import free_port

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "gone",
                        "cluster": {
                            "server": f"https://127.0.0.1:{free_port()}",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "c", "context": {"cluster": "gone", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    token = tmp_path / "token"
    token.write_text("some-token")
    auth = await KubernetesAuth.connect(str(kubeconfig))
    broker = Broker(BrokerConfig(data_dir=str(tmp_path / "data")))
    app = broker.make_app()
    BrokerAccess(auth, frozenset(), broker.metrics).protect(app)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await broker.start()
    url = f"http://127.0.0.1:{port}"
    try:
        async with client_session(token) as session:
            async with session.get(url + "/admin/v1/segments") as response:
                body = await response.json()
            assert response.status == 503, body
            assert body["error"]["code"] == "AuthUnavailable"
            assert "TokenReview failed" in body["error"]["message"]
            with pytest.raises(SegmentError) as refused:
                await SegmentProducer.connect(url, "ns", "t", 0, "p", session=session)
            assert refused.value.code == "AuthUnavailable"
            assert not isinstance(refused.value, AccessDeniedError)  # retryable
            async with session.get(url + "/healthz") as health:
                assert health.status == 200  # probes need no credentials
    finally:
        await broker.stop()
        await runner.cleanup()
        await auth.close()
    assert auth.token_reviews == 0 and len(auth._identities) == 0
    refusals = broker.metrics.auth_refusals.labels("AuthUnavailable")._value.get()
    assert refusals == 2
