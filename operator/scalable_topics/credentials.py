"""The bearer token a client presents to brokers and the operator (docs/security.md).

A projected ServiceAccount token for audience ``scalabletopics.io``, read from a file: the path
given, else ``$SCALABLE_TOPICS_TOKEN_FILE``, else :data:`DEFAULT_TOKEN_PATH` when it exists (the
mount path of the example client volume in manifests/examples/client-pod.yaml). The kubelet
rewrites the file before the token expires; :class:`TokenFile` re-reads it whenever its
modification time or inode changed, so every new connection carries the current token and no
restart is needed. Used by the SDK, the CLI, and the operator for the brokers' admin API.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import aiohttp
from aiohttp import hdrs

TOKEN_FILE_ENV = "SCALABLE_TOPICS_TOKEN_FILE"
DEFAULT_TOKEN_PATH = "/var/run/secrets/scalabletopics.io/serviceaccount/token"
CA_FILE_ENV = "SCALABLE_TOPICS_CA_FILE"
TLS_VERIFICATION_FAILED = "TLSVerificationFailed"
"""The code of the SDK's error for a server certificate its CA bundle does not verify."""


class CredentialsError(Exception):
    """A token file was named but cannot be read."""


class TokenFile:
    """A token file, re-read when it changes (stat per call: one syscall per connection)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""
        self.reads = 0

    def token(self) -> str:
        try:
            st = self.path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                self._token = self.path.read_text().strip()
                self._stamp = stamp
                self.reads += 1
        except OSError as exc:
            raise CredentialsError(f"token file {self.path}: {exc.strerror or exc}") from None
        return self._token

    def header(self) -> str:
        return f"Bearer {self.token()}"


def token_file(path: str | os.PathLike[str] | None = None) -> TokenFile | None:
    """The token file to use: ``path``, else ``$SCALABLE_TOPICS_TOKEN_FILE``, else the default
    path if it exists; None (anonymous) when there is none."""
    if path is not None and str(path):
        return TokenFile(path)
    named = os.environ.get(TOKEN_FILE_ENV)
    if named:
        return TokenFile(named)
    if Path(DEFAULT_TOKEN_PATH).is_file():
        return TokenFile(DEFAULT_TOKEN_PATH)
    return None


def bearer_middleware(tokens: TokenFile) -> aiohttp.ClientMiddlewareType:
    """An aiohttp client middleware setting ``Authorization`` on every request, WebSocket
    handshakes and each redirect hop included (aiohttp drops the header on a redirect to another
    host; the operator's consumer sessions redirect to the shard leader)."""

    async def middleware(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        request.headers[hdrs.AUTHORIZATION] = tokens.header()
        return await handler(request)

    return middleware


def client_ssl_context(ca_file: str | os.PathLike[str] | None = None) -> ssl.SSLContext | None:
    """The context verifying ``https``/``wss`` servers against the CA bundle ``ca_file``, else
    ``$SCALABLE_TOPICS_CA_FILE``; None (the system's CAs, aiohttp's default) when neither is
    set. Hostnames are checked: a certificate must name the host or IP of the URL."""
    named = str(ca_file) if ca_file is not None and str(ca_file) else os.environ.get(CA_FILE_ENV)
    if not named:
        return None
    try:
        return ssl.create_default_context(cafile=named)
    except (OSError, ssl.SSLError) as exc:
        raise CredentialsError(f"CA file {named}: {exc}") from None


def tls_connector(ca_file: str | os.PathLike[str] | None = None) -> aiohttp.TCPConnector | None:
    """A connector verifying with :func:`client_ssl_context`; None (aiohttp's default) without
    a CA bundle."""
    context = client_ssl_context(ca_file)
    return aiohttp.TCPConnector(ssl=context) if context is not None else None


def server_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The listener's context from a PEM certificate (chain) and key, read once: a rotated
    certificate takes effect at the next start (docs/security.md)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise CredentialsError(f"TLS certificate {cert_file} / key {key_file}: {exc}") from None
    return context


def tls_failure_message(url: str, exc: BaseException) -> str:
    """What the SDK says when a server's certificate does not verify (never retried)."""
    return (
        f"TLS verification of {url} failed: {exc}; pass the CA bundle that signed the server's "
        f"certificate (ca_file=, ${CA_FILE_ENV} or --ca-file)"
    )


def client_session(
    path: str | os.PathLike[str] | TokenFile | None = None,
    *,
    ca_file: str | os.PathLike[str] | None = None,
    **options: object,
) -> aiohttp.ClientSession:
    """An ``aiohttp.ClientSession`` presenting the token of :func:`token_file` (none found: a
    plain session, for servers that run without authentication) and verifying TLS servers
    against the CA bundle of :func:`client_ssl_context`."""
    tokens = path if isinstance(path, TokenFile) else token_file(path)
    middlewares = (bearer_middleware(tokens),) if tokens is not None else ()
    if "connector" not in options:
        options["connector"] = tls_connector(ca_file)
    return aiohttp.ClientSession(middlewares=middlewares, **options)  # type: ignore[arg-type]
