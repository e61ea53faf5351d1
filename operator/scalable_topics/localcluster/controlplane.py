"""The real Kubernetes control plane, run from the binary ``hack/kube`` builds (issue 21).

:class:`ControlPlane` runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler from
the multi-call binary (``kube <component> ...``) in a data directory, configured as a cluster
runs them: TLS everywhere, client certificates signed by a local CA, RBAC and Node
authorization, NodeRestriction on top of the default admission plugins, ServiceAccount tokens
signed by a key of the cluster's own, and each component authenticating as its own identity
(the controller-manager's controllers as their own ServiceAccounts). Everything listens on
127.0.0.1 only, on ports picked free at each start.

Layout of the data directory (kept across restarts; etcd's data carries the objects)::

    pki/                  CA, serving and client certificates, SA signing key (made once)
    etcd/                 etcd's data
    logs/<component>.log  each process's stdout and stderr, appended across starts
    admin.kubeconfig      system:masters client certificate (kubectl, tests)
    kube-controller-manager.kubeconfig, kube-scheduler.kubeconfig
    node-<name>.kubeconfig  a kubelet's (system:node:<name>), made by node_kubeconfig()
    flexvolume/           the controller-manager's FlexVolume directory (it creates one)

``cluster.LocalCluster`` (``make run``, ``stopic local up``) runs it with our kubelet
(``nodekubelet.py``) as its node. See docs/localcluster.md.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType

import aiohttp
import yaml

from .datadir import DataDirLock
from .processes import ManagedProcess, ProcessSpec

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
KUBE_DIR = REPO_ROOT / "hack" / "kube"
BUILD_SCRIPT = KUBE_DIR / "build.sh"
VERSIONS_FILE = KUBE_DIR / "versions.env"

HOST = "127.0.0.1"
SERVICE_CIDR = "127.16.0.0/16"
"""Service ClusterIPs come from loopback: the API server accepts a range in 127.0.0.0/8
(docs/dev/kube-real-plane.md), and no address outside the machine is ever handed out."""
SERVICE_IP = "127.16.0.1"
"""The ClusterIP of the ``kubernetes`` Service (first of :data:`SERVICE_CIDR`), named in the
API server's certificate as a real cluster's is."""
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

ETCD = "etcd"
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
COMPONENTS = (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER)

GO_GC_PERCENT = {APISERVER: "400"}
"""``GOGC`` of a component, unless the environment sets one. Go collects when the heap has grown
by this percentage of what the last collection kept (the default is 100). The API server decodes
and encodes every object of every request again, so its heap turns over fast: at 100 a fifth of
its CPU was garbage collection (a profile while 1,000 topics were created). At 400, three
alternating runs of ``python -m bench.operator`` measured 31.3 -> 24.8 CPU seconds for the same
8,600 requests (bench/README.md, operator). The cost is memory (up to five times what the last
collection kept instead of two), which a local cluster has; a real cluster's API server is tuned
by whoever runs it."""

ADMIN_USER = "kubernetes-admin"
ADMIN_GROUP = "system:masters"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
SCHEDULER_USER = "system:kube-scheduler"
"""The users the bootstrap RBAC policy grants the controller-manager's and scheduler's
permissions to: their client certificates carry exactly these names."""
NODE_USER_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"
"""A kubelet's identity: user ``system:node:<node name>`` in group ``system:nodes``, which the
Node authorizer and the NodeRestriction admission plugin recognise."""
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
"""The API server's identity towards kubelets (``kubectl logs`` goes through it); a kubelet
serves its API to this user only."""

CERT_DAYS = 3650
"""Every certificate lasts ten years: a data directory is a developer's, and a cluster that
stops starting after a year would be a surprise with nothing to gain."""

_SCRUBBED_ENV = re.compile(r"^(KUBERNETES_SERVICE_.*|KUBECONFIG|(HTTPS?|NO|ALL)_PROXY)$", re.I)
"""Removed from every component's environment: in-cluster settings of an enclosing cluster
(client-go would use them), and proxies (loopback traffic must never go through one)."""

_ADDRESS_IN_USE = "address already in use"
_PORT_ATTEMPTS = 3
_POLL = 0.1


class ControlPlaneError(RuntimeError):
    """The control plane could not be started (the message says which component and why)."""


class KubeBinaryError(ControlPlaneError):
    """The multi-call binary could not be located or built."""


class _PortTaken(ControlPlaneError):
    """A component found its port taken between the probe and its own bind."""


def pinned_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """``KEY=VALUE`` lines of ``hack/kube/versions.env`` (``KUBERNETES_VERSION``, ...)."""
    versions: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip()
    return versions


def kube_binary() -> Path:
    """The multi-call binary's path, built first if it is not in the cache yet.

    Runs ``hack/kube/build.sh`` (at nice 19: a first build compiles for about 14 minutes on two
    cores); its progress goes to this process's stderr, and the path is the last line it prints
    on stdout. When the binary exists, the script only prints its path.
    """
    if not BUILD_SCRIPT.is_file():
        raise KubeBinaryError(
            f"{BUILD_SCRIPT} not found: the control plane is built from a source checkout "
            "of the project (hack/kube)"
        )
    nice = shutil.which("nice")
    argv = [*([nice, "-n", "19"] if nice else []), str(BUILD_SCRIPT)]
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise KubeBinaryError(
            f"{BUILD_SCRIPT} failed (exit code {done.returncode}); its output is on stderr above"
        )
    binary = Path(lines[-1])
    if not os.access(binary, os.X_OK):
        raise KubeBinaryError(f"{BUILD_SCRIPT} named {binary}, which is not an executable file")
    return binary


# -- PKI ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Leaf:
    name: str
    subject: str
    usage: str
    sans: tuple[str, ...] = ()


_LEAVES = (
    _Leaf("etcd-server", "/CN=etcd-server", "serverAuth", (f"IP:{HOST}", "DNS:localhost")),
    _Leaf("apiserver-etcd-client", "/CN=kube-apiserver-etcd-client", "clientAuth"),
    _Leaf(
        "apiserver",
        "/CN=kube-apiserver",
        "serverAuth",
        (
            f"IP:{HOST}",
            f"IP:{SERVICE_IP}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ),
    ),
    _Leaf("admin", f"/O={ADMIN_GROUP}/CN={ADMIN_USER}", "clientAuth"),
    _Leaf(CONTROLLER_MANAGER, f"/CN={CONTROLLER_MANAGER_USER}", "clientAuth"),
    _Leaf(SCHEDULER, f"/CN={SCHEDULER_USER}", "clientAuth"),
)
_KUBELET_CLIENT = _Leaf("apiserver-kubelet-client", f"/CN={KUBELET_CLIENT_USER}", "clientAuth")
"""Made on demand (:func:`_ensure_leaf`) rather than listed in ``_LEAVES``: data directories
from before it existed get it at their next start."""
_SA_KEY = "sa.key"
_SA_PUB = "sa.pub"


def _pki_files() -> list[str]:
    files = ["ca.crt", "ca.key", _SA_KEY, _SA_PUB]
    for leaf in _LEAVES:
        files += [f"{leaf.name}.crt", f"{leaf.name}.key"]
    return files


def _openssl(openssl: str, *args: str, cwd: Path, input: str | None = None) -> str:
    done = subprocess.run(
        [openssl, *args], cwd=cwd, input=input, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ControlPlaneError(
            f"openssl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}"
        )
    return done.stdout


def _ec_key(openssl: str, path: str, cwd: Path) -> None:
    _openssl(
        openssl, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-out", path, cwd=cwd,
    )  # fmt: skip


def _issue(openssl: str, leaf: _Leaf, pki_dir: Path) -> None:
    """A key and a certificate for ``leaf`` signed by the CA in ``pki_dir``."""
    _ec_key(openssl, f"{leaf.name}.key", pki_dir)
    ext = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={leaf.usage}",
    ]
    if leaf.sans:
        ext.append(f"subjectAltName={','.join(leaf.sans)}")
    (pki_dir / f"{leaf.name}.ext").write_text("\n".join(ext) + "\n")
    csr = _openssl(
        openssl, "req", "-new", "-key", f"{leaf.name}.key", "-subj", leaf.subject, cwd=pki_dir
    )
    _openssl(
        openssl, "x509", "-req", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-set_serial", f"0x{secrets.token_hex(16)}", "-days", str(CERT_DAYS),
        "-extfile", f"{leaf.name}.ext", "-out", f"{leaf.name}.crt",
        cwd=pki_dir, input=csr,
    )  # fmt: skip
    (pki_dir / f"{leaf.name}.ext").unlink()
    (pki_dir / f"{leaf.name}.key").chmod(0o600)


def node_user(node_name: str) -> str:
    """The user a node's kubelet authenticates as (the Node authorizer keys on it)."""
    return f"{NODE_USER_PREFIX}{node_name}"


def _ensure_leaf(pki_dir: Path, leaf: _Leaf) -> str:
    """``leaf`` issued by the CA in ``pki_dir`` unless it exists; returns its file stem.

    For certificates made on demand, after the PKI (so data directories made before they
    existed get them too)."""
    if not (pki_dir / f"{leaf.name}.crt").is_file():
        openssl = shutil.which("openssl")
        if openssl is None:
            raise ControlPlaneError("openssl is not on PATH: it makes the cluster's certificates")
        _issue(openssl, leaf, pki_dir)
    return leaf.name


def _check_node_name(node_name: str) -> None:
    if not _NODE_NAME.fullmatch(node_name):
        raise ValueError(
            f"node name {node_name!r} must be a lowercase DNS label "
            "(letters, digits and '-', at most 63 characters)"
        )


def ensure_node_certificate(pki_dir: Path, node_name: str) -> str:
    """The kubelet client certificate of ``node_name`` (``CN=system:node:<name>``,
    ``O=system:nodes``), issued by the cluster's CA once; returns its file stem in ``pki_dir``."""
    _check_node_name(node_name)
    subject = f"/O={NODES_GROUP}/CN={node_user(node_name)}"
    return _ensure_leaf(pki_dir, _Leaf(f"node-{node_name}", subject, "clientAuth"))


def ensure_node_serving_certificate(pki_dir: Path, node_name: str) -> str:
    """The certificate the kubelet of ``node_name`` serves its API with (IP 127.0.0.1, where
    the API server reaches it); returns its file stem in ``pki_dir``."""
    _check_node_name(node_name)
    subject = f"/O={NODES_GROUP}/CN={node_user(node_name)}"
    sans = (f"IP:{HOST}", f"DNS:{node_name}")
    return _ensure_leaf(pki_dir, _Leaf(f"node-{node_name}-serving", subject, "serverAuth", sans))


def ensure_pki(pki_dir: Path) -> None:
    """Make the cluster's CA, certificates and ServiceAccount key once (openssl).

    Written to a temporary directory renamed into place, so a start interrupted half-way
    leaves no partial PKI behind; an existing complete one is kept (restarts reuse it).
    """
    if pki_dir.is_dir():
        missing = [name for name in _pki_files() if not (pki_dir / name).is_file()]
        if missing:
            raise ControlPlaneError(
                f"{pki_dir} lacks {', '.join(missing)}: remove the data directory to start over"
            )
        return
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ControlPlaneError("openssl is not on PATH: it makes the cluster's certificates")
    tmp = pki_dir.with_name(f".{pki_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, mode=0o700)
    _ec_key(openssl, "ca.key", tmp)
    _openssl(
        openssl, "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=scalable-topics-local-ca",
        "-days", str(CERT_DAYS), "-out", "ca.crt",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=tmp,
    )  # fmt: skip
    for leaf in _LEAVES:
        _issue(openssl, leaf, tmp)
    # RSA: the API server signs ServiceAccount tokens with RS256 by default.
    _openssl(
        openssl, "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
        "-out", _SA_KEY, cwd=tmp,
    )  # fmt: skip
    _openssl(openssl, "pkey", "-in", _SA_KEY, "-pubout", "-out", _SA_PUB, cwd=tmp)
    for key in tmp.glob("*.key"):
        key.chmod(0o600)
    tmp.replace(pki_dir)


def write_kubeconfig(path: Path, server: str, pki_dir: Path, cert: str, user: str) -> None:
    """A kubeconfig with the CA and a client certificate embedded, readable by its owner only."""

    def data(name: str) -> str:
        return base64.b64encode((pki_dir / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": server, "certificate-authority-data": data("ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": data(f"{cert}.crt"),
                    "client-key-data": data(f"{cert}.key"),
                },
            }
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.touch(mode=0o600)
    tmp.chmod(0o600)
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.replace(path)


# -- processes ------------------------------------------------------------------------------


def component_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) without :data:`_SCRUBBED_ENV`."""
    source = os.environ if base is None else base
    return {k: v for k, v in source.items() if not _SCRUBBED_ENV.match(k)}


def _with_gogc(component: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the component's :data:`GO_GC_PERCENT`, unless ``env`` has a ``GOGC``."""
    percent = GO_GC_PERCENT.get(component)
    if percent is not None and "GOGC" not in env:
        return {**env, "GOGC": percent}
    return env


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on :data:`HOST` now (all held open until all are picked)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @classmethod
    def pick(cls, api_port: int = 0) -> Ports:
        """Free ports, the API server's ``api_port`` when it is not 0."""
        etcd_client, etcd_peer, apiserver, controller_manager, scheduler = _free_ports(5)
        return cls(etcd_client, etcd_peer, api_port or apiserver, controller_manager, scheduler)


@dataclass
class _Running:
    name: str
    process: ManagedProcess
    log_offset: int
    exited: asyncio.Task[int]


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler in ``data_dir``.

    ``async with ControlPlane(tmp_path) as plane:`` serves the API on ``plane.url`` with an
    admin kubeconfig at ``plane.kubeconfig``; ``stop()`` then ``start()`` again on the same
    directory keeps every object (etcd's data is in it) and picks new ports.

    ``start()`` returns once etcd is healthy, the API server's ``/readyz`` passes (asked with
    the admin certificate), the controller-manager and scheduler serve ``/healthz``, and, unless
    ``await_default_service_account`` is false, the controller-manager has created the
    ``default`` ServiceAccount of the ``default`` namespace (Pods need it; on a fresh data
    directory this takes ~5 s more). It takes the directory's lock first (``DataDirLock``).
    ``binary`` defaults to :func:`kube_binary` (which builds it when missing). ``stop_grace`` is
    the time each process gets between SIGTERM and SIGKILL. ``api_port`` fixes the API server's
    port (0: a free one at each start).
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        binary: Path | str | None = None,
        ready_timeout: float = 120.0,
        stop_grace: float = 10.0,
        await_default_service_account: bool = True,
        api_port: int = 0,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.api_port = api_port
        self.binary = None if binary is None else Path(binary)
        self.ready_timeout = ready_timeout
        self.stop_grace = stop_grace
        self.await_default_service_account = await_default_service_account
        self.lock = DataDirLock(self.data_dir)
        self.ports: Ports | None = None
        self.timings: dict[str, float] = {}
        """Seconds from the start of ``start()`` to each readiness step of the last start:
        ``pki``, ``etcd``, ``kube-apiserver``, ``kube-controller-manager``,
        ``kube-scheduler`` and (when awaited) ``default-serviceaccount``."""
        self._running: dict[str, _Running] = {}
        self._stopping = False

    # -- paths ------------------------------------------------------------------------------

    @property
    def pki_dir(self) -> Path:
        return self.data_dir / "pki"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def kubeconfig(self) -> Path:
        """The admin (``system:masters``) kubeconfig."""
        return self.data_dir / "admin.kubeconfig"

    def component_kubeconfig(self, component: str) -> Path:
        """The kubeconfig ``kube-controller-manager`` or ``kube-scheduler`` runs with."""
        if component not in (CONTROLLER_MANAGER, SCHEDULER):
            raise ValueError(f"{component!r} has no kubeconfig of its own")
        return self.data_dir / f"{component}.kubeconfig"

    def node_kubeconfig(self, node_name: str) -> Path:
        """A kubeconfig for the kubelet of ``node_name``: a client certificate for
        ``system:node:<name>`` in ``system:nodes`` (made once, by the cluster's CA), and the
        API server's current address. Written again at each call (the port changes on
        restart); the plane must be running."""
        stem = ensure_node_certificate(self.pki_dir, node_name)
        path = self.data_dir / f"{stem}.kubeconfig"
        write_kubeconfig(path, self.url, self.pki_dir, stem, node_user(node_name))
        return path

    def node_serving_certificate(self, node_name: str) -> tuple[Path, Path]:
        """The certificate and key the kubelet of ``node_name`` serves its API with (made once
        by the cluster's CA); its clients' certificates chain to :attr:`ca_path`."""
        stem = ensure_node_serving_certificate(self.pki_dir, node_name)
        return self.pki_dir / f"{stem}.crt", self.pki_dir / f"{stem}.key"

    @property
    def ca_path(self) -> Path:
        return self.pki_dir / "ca.crt"

    def log_path(self, component: str) -> Path:
        return self.log_dir / f"{component}.log"

    @property
    def url(self) -> str:
        if self.ports is None:
            raise RuntimeError("the control plane is not running")
        return f"https://{HOST}:{self.ports.apiserver}"

    @property
    def pids(self) -> dict[str, int]:
        """The running components' process ids (each leads a process group of its own)."""
        return {name: run.process.pid for name, run in self._running.items() if run.process.pid}

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> ControlPlane:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        if self.lock.held:
            return
        self.lock.acquire()
        self._stopping = False
        try:
            binary = self.binary if self.binary else await asyncio.to_thread(kube_binary)
            began = time.monotonic()
            self.timings = {}
            await asyncio.to_thread(ensure_pki, self.pki_dir)
            self.timings["pki"] = time.monotonic() - began
            for attempt in range(1, _PORT_ATTEMPTS + 1):
                self.ports = Ports.pick(self.api_port)
                try:
                    await self._start_components(binary, began)
                    break
                except _PortTaken as exc:
                    await self._stop_components()
                    if attempt == _PORT_ATTEMPTS:
                        raise ControlPlaneError(str(exc)) from None
                    log.info("%s; retrying on other ports", exc)
            self.lock.publish(self.url)
        except BaseException:
            await self.stop()
            raise
        log.info(
            "control plane ready on %s in %.1fs (kubeconfig %s)",
            self.url,
            max(self.timings.values()),
            self.kubeconfig,
        )

    async def stop(self) -> None:
        """SIGTERM the components (scheduler and controller-manager, then the API server, then
        etcd, each after the previous ones exited), SIGKILL any still running after
        ``stop_grace``."""
        self._stopping = True
        try:
            await self._stop_components()
        finally:
            self.ports = None
            self.lock.release()

    async def _stop_components(self) -> None:
        for group in ((SCHEDULER, CONTROLLER_MANAGER), (APISERVER,), (ETCD,)):
            running = [self._running.pop(name) for name in group if name in self._running]
            await asyncio.gather(*(run.process.terminate(self.stop_grace) for run in running))
            await asyncio.gather(*(run.exited for run in running), return_exceptions=True)

    async def _start_components(self, binary: Path, began: float) -> None:
        ports = self.ports
        assert ports is not None
        pki = self.pki_dir
        ca = pki / "ca.crt"
        deadline = time.monotonic() + self.ready_timeout
        server = f"https://{HOST}:{ports.apiserver}"
        etcd_url = f"https://{HOST}:{ports.etcd_client}"
        peer_url = f"http://{HOST}:{ports.etcd_peer}"

        write_kubeconfig(self.kubeconfig, server, pki, "admin", ADMIN_USER)
        for component, user in (
            (CONTROLLER_MANAGER, CONTROLLER_MANAGER_USER),
            (SCHEDULER, SCHEDULER_USER),
        ):
            write_kubeconfig(self.component_kubeconfig(component), server, pki, component, user)
        etcd_tls = _client_tls(
            ca, pki / "apiserver-etcd-client.crt", pki / "apiserver-etcd-client.key"
        )
        admin_tls = _client_tls(ca, pki / "admin.crt", pki / "admin.key")
        # The controller-manager and scheduler serve with certificates they make in memory.
        unverified = ssl.create_default_context()
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE

        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as http:

            async def ok(url: str, tls: ssl.SSLContext, body: str | None = None) -> bool:
                try:
                    async with http.get(url, ssl=tls) as resp:
                        text = await resp.text()
                        return resp.status == 200 and (body is None or body in text)
                except (aiohttp.ClientError, TimeoutError, OSError):
                    return False

            etcd_args = [
                "--name=local",
                f"--data-dir={self.data_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=local={peer_url}",
                f"--cert-file={pki / 'etcd-server.crt'}",
                f"--key-file={pki / 'etcd-server.key'}",
                "--client-cert-auth",
                f"--trusted-ca-file={ca}",
                "--log-level=warn",
            ]
            await self._spawn(binary, ETCD, etcd_args)
            await self._await(ETCD, partial(ok, f"{etcd_url}/health", etcd_tls, '"true"'), deadline)
            self.timings[ETCD] = time.monotonic() - began

            kubelet_client = await asyncio.to_thread(_ensure_leaf, pki, _KUBELET_CLIENT)
            apiserver_args = [
                f"--advertise-address={HOST}",
                f"--bind-address={HOST}",
                f"--secure-port={ports.apiserver}",
                f"--etcd-servers={etcd_url}",
                f"--etcd-cafile={ca}",
                f"--etcd-certfile={pki / 'apiserver-etcd-client.crt'}",
                f"--etcd-keyfile={pki / 'apiserver-etcd-client.key'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={ca}",
                "--anonymous-auth=false",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki / _SA_PUB}",
                f"--service-account-signing-key-file={pki / _SA_KEY}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # No other API server instance shares the `kubernetes` Service's endpoints.
                "--endpoint-reconciler-type=none",
                # Kubelets (logs): reached at their InternalIP, their certificate checked.
                f"--kubelet-client-certificate={pki / f'{kubelet_client}.crt'}",
                f"--kubelet-client-key={pki / f'{kubelet_client}.key'}",
                f"--kubelet-certificate-authority={ca}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
            await self._spawn(binary, APISERVER, apiserver_args)
            await self._await(APISERVER, partial(ok, f"{server}/readyz", admin_tls), deadline)
            self.timings[APISERVER] = time.monotonic() - began

            controller_manager_args = [
                *self._component_args(CONTROLLER_MANAGER, ports.controller_manager),
                "--use-service-account-credentials=true",
                # Local Pods have loopback addresses, which Endpoints and EndpointSlices
                # refuse: these controllers would only fail (and post Warnings) forever.
                "--controllers=*,-endpoints-controller,-endpointslice-controller,"
                "-endpointslice-mirroring-controller",
                f"--root-ca-file={ca}",
                # The default is under /usr/libexec, which it would create.
                f"--flex-volume-plugin-dir={self.data_dir / 'flexvolume'}",
            ]
            await self._spawn(binary, CONTROLLER_MANAGER, controller_manager_args)
            await self._spawn(binary, SCHEDULER, self._component_args(SCHEDULER, ports.scheduler))
            for name, port in (
                (CONTROLLER_MANAGER, ports.controller_manager),
                (SCHEDULER, ports.scheduler),
            ):
                healthz = f"https://{HOST}:{port}/healthz"
                await self._await(name, partial(ok, healthz, unverified), deadline)
                self.timings[name] = time.monotonic() - began

            if self.await_default_service_account:
                sa = f"{server}/api/v1/namespaces/default/serviceaccounts/default"
                await self._await("default-serviceaccount", partial(ok, sa, admin_tls), deadline)
                self.timings["default-serviceaccount"] = time.monotonic() - began

    def _component_args(self, component: str, port: int) -> list[str]:
        """Flags the controller-manager and the scheduler share: their own identity for the API
        and for checking who calls their own endpoints, loopback only, no leader election."""
        kubeconfig = self.component_kubeconfig(component)
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            # There is no front proxy (requestheader) CA to look up in kube-system; without
            # this they log a missing CA bundle every few seconds.
            "--authentication-skip-lookup",
            f"--bind-address={HOST}",
            f"--secure-port={port}",
            "--leader-elect=false",
        ]

    async def _spawn(self, binary: Path, name: str, args: Sequence[str]) -> None:
        log_path = self.log_path(name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = log_path.stat().st_size if log_path.exists() else 0
        process = ManagedProcess(
            ProcessSpec(
                argv=[str(binary), name, *args],
                env=_with_gogc(name, component_env()),
                log_path=log_path,
                cwd=self.data_dir,
            )
        )
        await process.start()
        exited = asyncio.create_task(process.wait(), name=f"controlplane:{name}")
        run = _Running(name, process, offset, exited)
        self._running[name] = run
        exited.add_done_callback(lambda task: self._exited(run, task))

    def _exited(self, run: _Running, task: asyncio.Task[int]) -> None:
        if self._stopping or task.cancelled() or self._running.get(run.name) is not run:
            return
        log.error(
            "%s exited with code %s; the end of %s:\n%s",
            run.name,
            _exit_code(task),
            self.log_path(run.name),
            self._log_tail(run),
        )

    def _log_tail(self, run: _Running, lines: int = 20) -> str:
        try:
            with open(self.log_path(run.name), "rb") as f:
                f.seek(run.log_offset)
                text = f.read().decode(errors="replace")
        except OSError as exc:
            return f"(log unreadable: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    async def _await(
        self, what: str, ready: Callable[[], Awaitable[bool]], deadline: float
    ) -> None:
        """Poll ``ready`` until it holds; fail at once if a started component exits, or with the
        logs' tails at ``deadline``."""
        while True:
            for run in self._running.values():
                if run.exited.done():
                    tail = self._log_tail(run)
                    message = (
                        f"{run.name} exited with code {_exit_code(run.exited)} while waiting for "
                        f"{what}; the end of {self.log_path(run.name)}:\n{tail}"
                    )
                    if _ADDRESS_IN_USE in tail:
                        raise _PortTaken(message)
                    raise ControlPlaneError(message)
            if await ready():
                return
            if time.monotonic() > deadline:
                tails = "\n".join(
                    f"--- {self.log_path(run.name)}\n{self._log_tail(run, 8)}"
                    for run in self._running.values()
                )
                raise ControlPlaneError(
                    f"{what} not ready within {self.ready_timeout:g}s of the start:\n{tails}"
                )
            await asyncio.sleep(_POLL)


def _exit_code(task: asyncio.Task[int]) -> str:
    if task.cancelled():
        return "unknown (cancelled)"
    error = task.exception()
    return f"unknown ({error})" if error is not None else str(task.result())


def _client_tls(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    return context
