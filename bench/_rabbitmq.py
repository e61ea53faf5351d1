"""RabbitMQ streams as a peer: Debian's rabbitmq-server with its stream plugin, driven by
`bench/rabbitmq-stream/StreamBench.java` on RabbitMQ's own Java stream client.

Server: `rabbitmq-server` (Debian's package, installed with apt-get when missing, like
redis-server) runs from a temporary directory with its own node name, Erlang distribution and
epmd ports, AMQP and stream listeners on 127.0.0.1 and only the `rabbitmq_stream` plugin. It
is started the way systemd starts it (`RUNNING_UNDER_SYSTEMD`: the start script execs the Erlang
VM), so the server's process is the VM and its CPU is measured like any other server's. Ready
when the stream port answers.

Client: `bench/rabbitmq-stream/pom.xml` pins `com.rabbitmq:stream-client`; the first run
resolves it with `mvn dependency:copy-dependencies` from Maven Central into
`~/.cache/scalable-topics/rabbitmq-stream-<version>/lib` and compiles StreamBench.java next to
it (the stream project's own `stream-perf-test` is not on Maven Central, so this is the same
measurement in a few lines: a producer with a window of unconfirmed messages and publisher
confirms, a consumer from the first offset). Nothing lands in the repository.

Durability: a stream confirms a publish once its writer wrote it, without an fsync (RabbitMQ
relies on replication; `strace -f -e fsync,fdatasync` of the VM during a produce step shows
none), so it sits with the "ack before fsync" peers.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._kafka import java_major
from bench._procs import Server, ensure_debian_package, free_port, start_server, tcp_open
from scalable_topics.recommender.s3a import MavenMissing, cache_root, pom_property, resolve_into

POM = Path(__file__).resolve().parent / "rabbitmq-stream" / "pom.xml"
SOURCE = POM.parent / "StreamBench.java"
JAVA_MIN = 11
START_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
DURABILITY = (
    "stream, R1, publisher confirms: **ack before fsync** (a stream confirms once written; "
    "RabbitMQ relies on replication)"
)
READY_TIMEOUT = 90.0
"""The Erlang VM and RabbitMQ's boot steps take about 10 s here; more on a loaded machine."""


class RabbitUnavailable(RuntimeError):
    """rabbitmq-server, Java or Maven is missing: the row says why, the rest still runs."""


def client_version(pom: Path = POM) -> str:
    return pom_property(pom, "stream-client.version", release=True)


def ensure_client(pom: Path = POM, cache: Path | None = None) -> tuple[str, Path]:
    """``(java, directory)``: the client's jars in ``directory/lib`` and StreamBench compiled
    into ``directory/classes`` (resolved once; compiled again only when the source changed)."""
    java, javac = shutil.which("java"), shutil.which("javac")
    if not java or not javac:
        raise RabbitUnavailable("java/javac not found (apt-get install openjdk-17-jdk-headless)")
    r = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    if java_major(r.stderr + r.stdout) < JAVA_MIN:
        raise RabbitUnavailable(f"RabbitMQ's stream client needs Java {JAVA_MIN}+")
    root = cache or cache_root()
    home = root / f"rabbitmq-stream-{client_version(pom)}"
    source_stamp = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    marker = home / "complete"
    if marker.exists() and marker.read_text().strip() == source_stamp:
        return java, home
    lib = home / "lib"
    if not lib.is_dir():
        print(f"[bench] rabbitmq: resolving the stream client with Maven into {lib}", flush=True)
        try:
            resolve_into(pom, lib, root / "m2", timeout=900)
        except MavenMissing:
            raise RabbitUnavailable(
                "mvn not found: the stream client comes from Maven Central"
            ) from None
    classes = home / "classes"
    shutil.rmtree(classes, ignore_errors=True)
    res = subprocess.run(
        [javac, "-cp", str(lib / "*"), "-d", str(classes), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"javac StreamBench.java failed:\n{res.stderr[-3000:]}")
    marker.write_text(source_stamp + "\n")
    return java, home


def bench_command(endpoint: dict[str, Any], *args: str) -> list[str]:
    home = Path(endpoint["client"])
    classpath = f"{home / 'classes'}:{home / 'lib' / '*'}"
    return [
        str(endpoint["java"]),
        "-Xmx512m",
        "-cp",
        classpath,
        "StreamBench",
        "-host",
        "127.0.0.1",
        "-port",
        str(endpoint["port"]),
        *args,
    ]


def server_version() -> str:
    r = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"],
        capture_output=True,
        text=True,
        check=False,
    )
    return f"RabbitMQ {r.stdout.strip()}" if r.returncode == 0 else "RabbitMQ"


def _kill_epmd(port: int) -> None:
    epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([epmd, "-port", str(port), "-kill"], capture_output=True, timeout=10)


@dataclass
class RabbitServer(Server):
    """The VM, plus the epmd daemon it started on its own port (stopped with it)."""

    epmd_port: int = 0

    def stop(self, timeout: float = 30.0) -> None:
        super().stop(timeout)
        _kill_epmd(self.epmd_port)


def start_rabbitmq(workdir: Path) -> tuple[Server, dict[str, Any], str]:
    try:
        ensure_debian_package("rabbitmq-server", "rabbitmq-server")
        java, client = ensure_client()
    except RuntimeError as e:
        raise RabbitUnavailable(str(e)) from e
    if not START_SCRIPT.exists():
        raise RabbitUnavailable(f"{START_SCRIPT} not found (Debian's rabbitmq-server layout)")
    stream_port, amqp_port, dist_port, epmd_port = (free_port() for _ in range(4))
    (workdir / "rabbitmq.conf").write_text(
        f"listeners.tcp.default = 127.0.0.1:{amqp_port}\n"
        f"stream.listeners.tcp.1 = 127.0.0.1:{stream_port}\n"
        "stream.advertised_host = 127.0.0.1\n"
        f"stream.advertised_port = {stream_port}\n"
    )
    (workdir / "enabled_plugins").write_text("[rabbitmq_stream].\n")
    env = {
        "PATH": "/usr/lib/rabbitmq/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "HOME": str(workdir),
        "LANG": "C.UTF-8",
        "RUNNING_UNDER_SYSTEMD": "1",
        "RABBITMQ_NODENAME": f"bench{stream_port}@localhost",
        "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(workdir / "log"),
        "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "ERL_EPMD_PORT": str(epmd_port),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
    }
    try:
        started = start_server(
            "rabbitmq-server",
            [str(START_SCRIPT)],
            workdir,
            stream_port,
            lambda: tcp_open(stream_port),
            timeout=READY_TIMEOUT,
            env=env,
        )
    except RuntimeError:
        _kill_epmd(epmd_port)
        raise
    server = RabbitServer(
        started.name, started.proc, started.workdir, started.log_path, started.port, epmd_port
    )
    endpoint = {"port": stream_port, "java": java, "client": str(client)}
    return server, endpoint, server_version()
