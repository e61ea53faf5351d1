"""Every shell command in ``README.md``, ``docs/**/*.md`` and the other READMEs runs as
documented, so a documented command that breaks fails the suite (issue 20). What counts as a
command is ``tests/docs_commands.py``; each one is classified here, in :data:`RUN` or
:data:`NOT_RUN` with its reason, and a test fails on a command that is in neither (a newly
documented one) or on a table entry the docs no longer have.

The commands run verbatim, ``bash -c`` with ``set -eo pipefail``, one doc file as one terminal
session: its ``export`` lines (and a ``cd``) carry over to its next commands. The session starts
in a scratch directory laid out like a checkout (symlinks to the repository's top-level entries,
so ``$PWD/.venv/bin``, ``crds/`` and ``manifests/...`` resolve), as a terminal where the project
is installed: ``.venv/bin`` on ``PATH`` (README's ``export PATH`` line), no ``KUBECONFIG``, and
``HOME`` a scratch home whose ``~/.kube/config`` is the test cluster's kubeconfig, so the docs'
``~/.kube/config`` and commands without a kubeconfig reach it. The one substitution is the
docs' placeholder ``DIR`` (the word), replaced by a fresh temporary directory per session.

The test cluster is the documented ``stopic local up --data-dir .local/run``
(``docs/localcluster.md``), started in the scratch checkout for the module and stopped with
SIGINT at the end (it must exit 0 within :data:`STOP_WITHIN` s). The operator and brokers come
from ``docs/operator.md``'s own commands (:data:`DEPLOY_DOC`), run before any other doc. Each doc
that uses the ``orders`` topic starts from a fresh one (deleted with its segments, applied from
``manifests/examples/orders.yaml``, Ready): its examples assume one.

Each command must exit 0 within :data:`COMMAND_TIMEOUT` s unless its entry says otherwise;
commands that run in the foreground until Ctrl-C are :class:`Interrupt` (stopped with SIGINT
once they have shown what they are for, then exit 130 within :data:`INTERRUPT_WITHIN` s) or
:class:`Background` (serve until a later command of the same doc stops them, then exit 0).
Where a console block shows a command's output, its output must mention what the docs' output
leads with (``docs_commands.expected_lead``: a table's header, the first stable words).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scalable_topics.localcluster.controlplane import kube_binary
from tests.docs_commands import DocCommand, expected_lead, extract_all, mentions

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT = 120.0
"""Seconds any one documented command may take."""
INTERRUPT_WITHIN = 2.0
"""Ctrl-C ends a foreground command within this many seconds (docs/client.md, README)."""
STOP_WITHIN = 5.0
"""Seconds the control plane gets to exit 0 after SIGINT (or ``local down``)."""
READY_WITHIN = 150.0
"""Seconds for the stack to come up and for a fresh ``orders`` to be Ready."""
TOPIC = "orders"
TOPIC_MANIFEST = "manifests/examples/orders.yaml"
DEPLOY_DOC = "docs/operator.md"
NOT_LINKED = frozenset({".git", ".local", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
"""Top-level entries of the repository the scratch checkout does not link (its own ``.local``
is the test cluster's state)."""


@dataclass(frozen=True)
class Exits:
    """Runs to completion: exit status ``code`` within ``within`` s, its output naming each of
    ``mentions``."""

    code: int = 0
    mentions: tuple[str, ...] = ()
    within: float = COMMAND_TIMEOUT


@dataclass(frozen=True)
class Interrupt:
    """Runs in the foreground until Ctrl-C: once its stdout shows ``shows``, SIGINT to its
    process group (what Ctrl-C does); it must exit 130 within :data:`INTERRUPT_WITHIN` s."""

    shows: str


@dataclass(frozen=True)
class Background:
    """Serves in the foreground until stopped: left running once its stdout shows ``ready``
    and ``files`` exist; a later command of the same doc must stop it, and it must then exit 0."""

    ready: str
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fixture:
    """Started by this module's cluster fixture (:func:`checkout`), the test cluster itself."""


How = Exits | Interrupt | Background | Fixture

SERVING = "local control plane serving on"
DAG_SHOWN = f"default/{TOPIC}:"

RUN: dict[tuple[str, str], How | tuple[How, ...]] = {
    ("README.md", 'export PATH="$PWD/.local/run/bin:$PWD/.venv/bin:$PATH"'): Exits(),
    ("README.md", 'export KUBECONFIG="$PWD/.local/run/kubeconfig"'): Exits(),
    ("README.md", "kubectl get stopic,seg; kubectl stopic dag orders --watch"): Interrupt(
        DAG_SHOWN
    ),
    ("README.md", "kubectl get stopic orders -o wide"): Exits(),
    ("README.md", "kubectl stopic dag orders"): Exits(),
    ("docs/client.md", "export KUBECONFIG=.local/run/kubeconfig"): Exits(),
    ("docs/client.md", "stopic produce orders --count 5 --keys 2"): Exits(
        mentions=("sent 5 message(s)",)
    ),
    (
        "docs/client.md",
        "printf 'customer-7\\t{\"total\": 12}\\nheartbeat\\n' | stopic produce orders --stdin",
    ): Exits(mentions=("sent 2 message(s)",)),
    ("docs/client.md", "stopic consume orders -s billing --count 7"): Exits(
        mentions=("key-1\tmessage-3", 'customer-7\t{"total": 12}', "received 7 message(s)")
    ),
    ("docs/client.md", "stopic consume orders -s audit -o json --count 1"): Exits(
        mentions=("received 1 message(s)",)
    ),
    ("docs/client.md", "stopic dag orders"): Exits(mentions=(DAG_SHOWN,)),
    ("docs/client.md", "stopic split orders 0 --at 3fff"): Exits(
        mentions=("Succeeded", "#2 0000-3fff, #3 4000-7fff")
    ),
    ("docs/client.md", "stopic merge orders 2 3"): Exits(
        mentions=("Succeeded", "#2 0000-3fff + #3 4000-7fff -> #4 0000-7fff")
    ),
    ("docs/localcluster.md", "stopic local up --data-dir .local/run"): (
        Fixture(),
        Exits(75, mentions=("is in use by a running local control plane",)),
    ),
    ("docs/localcluster.md", "stopic local up --data-dir DIR --api-port 6443 --no-kubelet"): (
        Background(SERVING, files=("DIR/kubeconfig",))
    ),
    ("docs/localcluster.md", "export KUBECONFIG=DIR/kubeconfig && kubectl get ns"): Exits(
        mentions=("kube-system",)
    ),
    ("docs/localcluster.md", "stopic local down --data-dir DIR"): Exits(mentions=("stopped",)),
    ("docs/localcluster.md", "stopic local reset --data-dir DIR"): Exits(mentions=("removed",)),
    ("docs/localcluster.md", 'export PATH="$PWD/.venv/bin:$PATH"'): Exits(),
    ("docs/operations.md", "kubectl apply -f crds/"): Exits(),
    ("docs/operations.md", "kubectl apply -f manifests/examples/orders.yaml"): Exits(),
    ("docs/operations.md", "kubectl wait --for=condition=Ready stopic/orders"): Exits(),
    (
        "docs/operations.md",
        "SCALABLE_TOPICS_E2E_KUBECONFIG=~/.kube/config .venv/bin/pytest tests/e2e -m e2e",
    ): Exits(mentions=("passed",)),
    ("docs/operations.md", "kubectl get stopic -A -o wide"): Exits(mentions=(TOPIC,)),
    ("docs/operations.md", "kubectl describe stopic orders"): Exits(mentions=("Conditions",)),
    ("docs/operations.md", "kubectl get seg -l scalabletopics.io/topic=orders"): Exits(
        mentions=(f"{TOPIC}-0",)
    ),
    ("docs/operations.md", "kubectl stopic dag orders --watch"): Interrupt(DAG_SHOWN),
    ("docs/operations.md", "kubectl stopic move orders 1 --to segment-broker-2"): Exits(),
    ("docs/operations.md", "kubectl stopic drain segment-broker-1"): Exits(),
    ("docs/operations.md", "kubectl stopic uncordon segment-broker-1"): Exits(),
    ("docs/security.md", "kubectl create serviceaccount orders-writer"): Exits(),
    (
        "docs/security.md",
        "kubectl create rolebinding orders-writer --clusterrole=scalable-topics-producer "
        "--serviceaccount=default:orders-writer",
    ): Exits(),
    (
        "docs/security.md",
        "kubectl label namespace default scalabletopics.io/client=true --overwrite",
    ): Exits(),
    (
        "docs/security.md",
        "kubectl auth can-i produce scalabletopics.scalabletopics.io/orders "
        "--as=system:serviceaccount:default:orders-writer",
    ): Exits(mentions=("yes",)),
    (
        "docs/security.md",
        "kubectl create token orders-writer --audience=scalabletopics.io --duration=1h > token",
    ): Exits(),
    (
        "docs/security.md",
        "SCALABLE_TOPICS_TOKEN_FILE=$PWD/token stopic produce orders --count 10",
    ): Exits(mentions=("sent 10",)),
    ("docs/operator.md", "kubectl apply -f crds/"): Exits(),
    ("manifests/examples/README.md", "kubectl apply -f crds/"): Exits(),
    ("manifests/examples/README.md", "kubectl apply -f manifests/examples/orders.yaml"): Exits(),
    ("manifests/examples/README.md", "kubectl get stopic orders -o wide"): Exits(
        mentions=("REASON", "CONTROLLER", "INITIAL")
    ),
    ("manifests/examples/README.md", "kubectl get seg -l scalabletopics.io/topic=orders"): Exits(
        mentions=(f"{TOPIC}-0",)
    ),
    ("manifests/examples/README.md", "kubectl describe stopic orders"): Exits(
        mentions=("Conditions",)
    ),
    (
        "manifests/examples/README.md",
        "kubectl wait stopic/orders --for=condition=Ready --timeout=60s",
    ): Exits(mentions=("condition met",)),
    (
        "manifests/examples/README.md",
        "kubectl annotate stopic orders --overwrite scalabletopics.io/request="
        '\'{"id": "split-1", "op": "split", "segments": [0]}\'',
    ): Exits(),
    (
        "manifests/examples/README.md",
        "kubectl get stopic orders -o jsonpath='{.status.lastRequest}'",
    ): Exits(),
    (
        "manifests/examples/README.md",
        "kubectl annotate stopic orders --overwrite scalabletopics.io/request="
        '\'{"id": "merge-1", "op": "merge", "segments": [2, 3]}\'',
    ): Exits(),
    (
        "manifests/examples/README.md",
        'kubectl patch stopic orders --type merge -p \'{"spec": {"initialSegments": 4}}\'',
    ): Exits(1, mentions=("initialSegments is immutable",)),
    (
        "manifests/examples/README.md",
        "kubectl patch stopic orders --type merge -p "
        '\'{"spec": {"autoScale": {"minSegments": 9}}}\'',
    ): Exits(1, mentions=("maxSegments must be >= minSegments",)),
    ("docs/operator.md", "kubectl apply -k manifests/overlays/local"): Exits(),
    ("docs/resources.md", "kubectl get stopic"): Exits(),
    ("docs/resources.md", "kubectl get stopic -o wide"): Exits(
        mentions=("REASON", "CONTROLLER", "INITIAL")
    ),
    (
        "docs/resources.md",
        "kubectl annotate stopic orders --overwrite scalabletopics.io/request="
        '\'{"id": "split-1", "op": "split", "segments": [0], "at": 16383}\'',
    ): Exits(),
    ("docs/resources.md", "kubectl get seg -l scalabletopics.io/topic=orders"): Exits(),
}
"""How each documented command that runs here is run (a tuple: one per occurrence in the file)."""

PRODUCTION = (
    "production images and settings for a real cluster; here it would replace the local "
    "overlay's objects (same names). tests/e2e, run above, checks a deployed cluster"
)
BENCH = (
    "a benchmark of minutes that starts its own brokers and peers (make bench); "
    "tests/integration/test_bench_smoke.py runs its quick form"
)
TRUNCATE = (
    "the repair of a corrupted segment: it needs a damaged log and port-forward, which the "
    "embedded control plane lacks; tests/integration/test_operator_corruption.py makes the same "
    "admin call (SegmentAdmin.truncate) on a segment it corrupted"
)
OWN_CLUSTER = (
    "a container engine and a kind cluster (none here); "
    "tests/integration/test_demo_existing_cluster.py runs `stopic demo --existing-cluster` "
    "against the local control plane as a cluster of your own"
)
NOT_RUN: dict[tuple[str, str], str] = {
    ("README.md", "make run"): (
        "the demo runs on .local/run, which this module's cluster (the same control plane, "
        "operator and brokers) holds; README's next lines run against that; "
        "tests/integration/test_demo_start_state.py covers the demo's start"
    ),
    ("README.md", "make test"): "the suite this test is part of",
    ("README.md", "docker build -t scalable-topics/operator:dev ."): OWN_CLUSTER,
    (
        "README.md",
        "docker build -f broker-image/Dockerfile -t scalable-topics/segment-broker:dev .",
    ): OWN_CLUSTER,
    (
        "README.md",
        "kind load docker-image scalable-topics/operator:dev scalable-topics/segment-broker:dev",
    ): OWN_CLUSTER,
    (
        "README.md",
        "make run CLUSTER=existing CONTEXT=kind-kind OPERATOR_IMAGE=scalable-topics/operator:dev "
        "BROKER_IMAGE=scalable-topics/segment-broker:dev",
    ): OWN_CLUSTER,
    ("README.md", "kubectl delete namespace scalable-topics-demo"): OWN_CLUSTER,
    ("docs/correctness.md", ".venv/bin/pytest -s tests/integration/test_chaos.py"): (
        "part of this suite"
    ),
    ("docs/correctness.md", ".venv/bin/pytest -s tests/integration/test_chaos_keyshared.py"): (
        "part of this suite"
    ),
    ("docs/correctness.md", ".venv/bin/python -m bench.run --only chaos"): BENCH,
    ("docs/correctness.md", ".venv/bin/python -m bench.chaos --runs 3"): BENCH,
    (
        "docs/operations.md",
        "kubectl -n scalable-topics port-forward pod/segment-broker-0 18080:8080 &",
    ): (TRUNCATE),
    (
        "docs/operations.md",
        "curl -sS -X POST http://127.0.0.1:18080/admin/v1/segments/default/orders/3/truncate "
        "-H 'Content-Type: application/json' "
        """-d '{"position": 1234, "acknowledgeLoss": "default/orders/3"}'""",
    ): TRUNCATE,
    ("bench/README.md", "make bench"): BENCH,
    ("bench/README.md", ".venv/bin/python -m bench.run --quick"): BENCH,
    ("bench/README.md", ".venv/bin/python -m bench.run --only broker"): BENCH,
    ("docs/operations.md", "kubectl apply -k manifests/base"): PRODUCTION,
    ("docs/operator.md", "kubectl apply -k manifests/base"): PRODUCTION,
    (
        "docs/operator.md",
        ".venv/bin/pytest -q tests/integration/test_operator_*.py",
    ): "part of this suite",
}


def classification(commands: list[DocCommand]) -> list[str]:
    """Every mismatch between the documented ``commands`` and RUN/NOT_RUN, one line each."""
    problems: list[str] = []
    counts = Counter((c.file, c.command) for c in commands)
    first = {(c.file, c.command): c for c in reversed(commands)}
    for key, doc in first.items():
        if key in RUN and key in NOT_RUN:
            problems.append(f"{doc.where()}: `{doc.command}` is in both RUN and NOT_RUN")
        elif key not in RUN and key not in NOT_RUN:
            problems.append(
                f"{doc.where()}: `{doc.command}` is documented but in neither RUN nor NOT_RUN "
                "(run it, or say in NOT_RUN why it cannot run here)"
            )
        elif key in RUN:
            how = RUN[key]
            wanted = len(how) if isinstance(how, tuple) else 1
            if wanted != counts[key]:
                problems.append(
                    f"{doc.where()}: `{doc.command}` appears {counts[key]} time(s) in "
                    f"{doc.file}, RUN describes {wanted}"
                )
    for table, keys in (("RUN", RUN), ("NOT_RUN", NOT_RUN)):
        for file, command in keys:
            if (file, command) not in counts:
                problems.append(f"{table} lists `{command}` for {file}, which no longer has it")
    return problems


def how_to_run(doc: DocCommand) -> How | None:
    """The entry for ``doc`` (``None``: not run)."""
    how = RUN.get((doc.file, doc.command))
    if isinstance(how, tuple):
        return how[doc.occurrence - 1] if doc.occurrence <= len(how) else None
    return how


DOCUMENTED = extract_all(REPO)
SESSIONS = [
    file
    for file in dict.fromkeys(c.file for c in DOCUMENTED)
    if file != DEPLOY_DOC
    and any(
        isinstance(how_to_run(c), Exits | Interrupt | Background)
        for c in DOCUMENTED
        if c.file == file
    )
]


def test_every_documented_command_is_run_or_says_why_not() -> None:
    assert DOCUMENTED, "no command found in README.md and docs/"
    problems = classification(DOCUMENTED)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


# -- running commands as a terminal would --------------------------------------------------------


def _tail(path: Path, limit: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text if len(text) <= limit else "…" + text[-limit:]


def _until(what: str, done: Callable[[], bool], within: float, interval: float = 0.2) -> None:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Running:
    doc: DocCommand
    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    started: float = field(default_factory=time.monotonic)

    def out(self) -> str:
        return self.stdout.read_text(errors="replace") if self.stdout.exists() else ""

    def err(self) -> str:
        return self.stderr.read_text(errors="replace") if self.stderr.exists() else ""

    def report(self, problem: str) -> str:
        return (
            f"{self.doc.where()}: `{self.doc.command}` {problem} "
            f"(after {time.monotonic() - self.started:.1f}s)\n"
            f"--- stdout (tail) ---\n{_tail(self.stdout)}\n"
            f"--- stderr (tail) ---\n{_tail(self.stderr)}"
        )

    def signal(self, signum: int) -> None:
        """``signum`` to the command's process group (its shell and what it runs)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)

    def wait(self, within: float) -> int | None:
        try:
            return self.proc.wait(within)
        except subprocess.TimeoutExpired:
            return None


class Session:
    """One terminal: the doc file's commands in order, ``export``s carried from one to the
    next through the environment each shell leaves behind."""

    def __init__(self, work: Path, logs: Path, env: dict[str, str], placeholder: Path) -> None:
        self.cwd = work
        self.logs = logs
        self.env = dict(env)
        self.placeholder = placeholder
        self.background: list[Running] = []
        self.count = 0
        logs.mkdir(parents=True, exist_ok=True)

    def substitute(self, text: str) -> str:
        return re.sub(r"(?<![\w-])DIR(?![\w-])", str(self.placeholder), text)

    def start(self, doc: DocCommand) -> Running:
        self.count += 1
        base = self.logs / f"{self.count:02d}"
        state = base.with_suffix(".env")
        script = (
            "set -eo pipefail\n"
            f"trap '__rc=$?; env -0 > {shlex.quote(str(state))}; "
            f'printf %s "$PWD" > {shlex.quote(str(state))}.pwd; exit $__rc\' EXIT\n'
            f"{self.substitute(doc.command)}\n"
        )
        with (
            base.with_suffix(".out").open("wb") as out,
            base.with_suffix(".err").open("wb") as err,
        ):
            proc = subprocess.Popen(
                ["bash", "-c", script],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        return Running(doc, proc, base.with_suffix(".out"), base.with_suffix(".err"))

    def carry_over(self, running: Running) -> None:
        """Take the environment and directory the command's shell ended with."""
        state = running.stdout.with_suffix(".env")
        if not state.exists():
            return
        pairs = (item.split("=", 1) for item in state.read_bytes().decode().split("\0") if item)
        env = {k: v for k, v in (p for p in pairs if len(p) == 2)}
        for name in ("_", "SHLVL", "OLDPWD", "PWD"):
            env.pop(name, None)
        self.env = env
        pwd = Path(f"{state}.pwd")
        if pwd.exists() and pwd.read_text():
            self.cwd = Path(pwd.read_text())

    def run(self, doc: DocCommand, how: Exits | Interrupt | Background) -> Running:
        running = self.start(doc)
        try:
            if isinstance(how, Exits):
                self._exits(running, how)
            elif isinstance(how, Interrupt):
                self._interrupt(running, how)
            else:
                self._background(running, how)
                return running
        finally:
            if running.proc.poll() is None and not isinstance(how, Background):
                running.signal(signal.SIGKILL)
                running.proc.wait()
        self.carry_over(running)
        return running

    def _exits(self, running: Running, how: Exits) -> None:
        rc = running.wait(how.within)
        assert rc is not None, running.report(f"did not finish within {how.within:g}s")
        assert rc == how.code, running.report(f"exited {rc}, expected {how.code}")
        said = running.out() + running.err()
        lead = expected_lead(running.doc.output)
        for wanted in (lead, *how.mentions) if lead else how.mentions:
            assert mentions(said, wanted), running.report(f"does not say {wanted!r}")

    def _interrupt(self, running: Running, how: Interrupt) -> None:
        _until_shown(running, how.shows)
        running.signal(signal.SIGINT)
        interrupted = time.monotonic()
        rc = running.wait(INTERRUPT_WITHIN)
        took = time.monotonic() - interrupted
        assert rc is not None, running.report(f"still runs {INTERRUPT_WITHIN:g}s after Ctrl-C")
        assert rc == 130, running.report(f"exited {rc} on Ctrl-C, expected 130 ({took:.1f}s)")

    def _background(self, running: Running, how: Background) -> None:
        self.background.append(running)
        _until_shown(running, how.ready)
        for name in how.files:
            path = Path(self.substitute(name))
            _until(f"{path} after {running.doc.command!r}", path.exists, COMMAND_TIMEOUT)

    def finish(self) -> None:
        """Each background command must have been stopped by the doc, and exited 0."""
        try:
            for running in self.background:
                rc = running.wait(STOP_WITHIN)
                assert rc is not None, running.report(
                    "still runs after the doc's last command (nothing documented stopped it)"
                )
                assert rc == 0, running.report(f"exited {rc} when stopped, expected 0")
        finally:
            self.close()

    def close(self) -> None:
        for running in self.background:
            if running.proc.poll() is None:
                running.signal(signal.SIGKILL)
                running.proc.wait()


def _until_shown(running: Running, text: str) -> None:
    def shown() -> bool:
        return text in running.out() or running.proc.poll() is not None

    deadline = time.monotonic() + COMMAND_TIMEOUT
    while not shown():
        assert time.monotonic() < deadline, running.report(
            f"did not show {text!r} within {COMMAND_TIMEOUT:g}s"
        )
        time.sleep(0.1)
    assert running.proc.poll() is None, running.report(
        f"exited {running.proc.returncode} instead of running in the foreground"
    )


# -- the scratch checkout and its cluster ----------------------------------------------------------


@dataclass
class Checkout:
    work: Path
    env: dict[str, str]
    logs: Path
    kubeconfig: Path

    def kubectl(
        self, *args: str, check: bool = True, within: float = COMMAND_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=within,
        )
        if check and result.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr or result.stdout}")
        return result

    def session(self, name: str, placeholder: Path) -> Session:
        return Session(self.work, self.logs / name.replace("/", "_"), self.env, placeholder)


def _terminal_env(work: Path) -> dict[str, str]:
    """A terminal where the project is installed, no kubeconfig chosen, and a scratch home."""
    venv_bin = str(REPO / ".venv" / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"KUBECONFIG", "VIRTUAL_ENV"} and not k.startswith("PYTEST_")
    }
    env["PATH"] = os.pathsep.join([str(work / ".venv" / "bin"), *path])
    env["HOME"] = str(work / "home")
    # This machine's build of the Kubernetes binaries (built here first if missing): the scratch
    # home's cache has none, and a build takes minutes.
    env["SCALABLE_TOPICS_CACHE"] = str(kube_binary().parents[2])
    return env


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Checkout]:
    """The scratch checkout, with the test cluster the docs start running in it."""
    work = tmp_path_factory.mktemp("checkout")
    for entry in sorted(REPO.iterdir()):
        if entry.name not in NOT_LINKED:
            (work / entry.name).symlink_to(entry)
    (work / "home" / ".kube").mkdir(parents=True)
    env = _terminal_env(work)
    logs = tmp_path_factory.mktemp("doc-sessions")
    starts = [d for d in DOCUMENTED if isinstance(how_to_run(d), Fixture)]
    assert len(starts) == 1, f"one documented command starts the test cluster, not {starts}"
    fixture = starts[0]
    up = Session(work, logs / "cluster", env, tmp_path_factory.mktemp("DIR"))
    running = up.start(fixture)
    try:
        _until_shown(running, SERVING)
        kubeconfig = work / ".local" / "run" / "kubeconfig"
        shutil.copyfile(kubeconfig, work / "home" / ".kube" / "config")
        yield Checkout(work, env, logs, kubeconfig)
        running.signal(signal.SIGINT)
        rc = running.wait(STOP_WITHIN)
        assert rc is not None, running.report(f"still runs {STOP_WITHIN:g}s after Ctrl-C")
        assert rc == 0, running.report(f"exited {rc} on Ctrl-C, expected 0")
    finally:
        if running.proc.poll() is None:
            running.signal(signal.SIGKILL)
            running.proc.wait()


def run_doc(checkout: Checkout, file: str, placeholder: Path) -> None:
    """Run ``file``'s commands as one session; fail on the first that does not do what its
    entry says."""
    session = checkout.session(file, placeholder)
    try:
        for doc in DOCUMENTED:
            how = how_to_run(doc) if doc.file == file else None
            if isinstance(how, Exits | Interrupt | Background):
                session.run(doc, how)
        session.finish()
    finally:
        session.close()


def _pods_ready(checkout: Checkout, selector: str) -> int:
    listed = checkout.kubectl("get", "pods", "-A", "-l", selector, "-o", "json").stdout
    return sum(
        any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        for pod in json.loads(listed)["items"]
    )


@pytest.fixture(scope="module")
def deployed(checkout: Checkout, tmp_path_factory: pytest.TempPathFactory) -> Checkout:
    """The operator and brokers, deployed by :data:`DEPLOY_DOC`'s own commands."""
    run_doc(checkout, DEPLOY_DOC, tmp_path_factory.mktemp("DIR"))
    return checkout


def fresh_topic(checkout: Checkout) -> None:
    """``orders`` as the docs' examples assume it: just created from its manifest, Ready."""
    checkout.kubectl("delete", "stopic", TOPIC, "--ignore-not-found", "--wait=false")

    def gone() -> bool:
        left = checkout.kubectl(
            "get", "stopic,seg", "-l", f"scalabletopics.io/topic={TOPIC}", "-o", "name"
        ).stdout.split()
        topic = checkout.kubectl("get", "stopic", TOPIC, "--ignore-not-found", "-o", "name")
        return not left and not topic.stdout.strip()

    _until(f"{TOPIC} and its segments to be deleted", gone, READY_WITHIN, interval=0.5)
    checkout.kubectl("apply", "-f", str(REPO / TOPIC_MANIFEST))
    checkout.kubectl(
        "wait",
        "--for=condition=Ready",
        f"stopic/{TOPIC}",
        f"--timeout={READY_WITHIN:.0f}s",
        within=READY_WITHIN + 10,
    )


def test_deployment_doc_brings_up_the_operator_and_brokers(deployed: Checkout) -> None:
    def up() -> bool:
        return (
            _pods_ready(deployed, "app.kubernetes.io/name=segment-broker") == 3
            and _pods_ready(deployed, "app.kubernetes.io/name=scalable-topics-operator") >= 1
        )

    _until("3 ready brokers and a ready operator", up, READY_WITHIN, interval=0.5)


@pytest.mark.parametrize("file", SESSIONS)
def test_documented_commands_run(
    file: str, deployed: Checkout, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if any(re.search(rf"\b{TOPIC}\b", c.command) for c in DOCUMENTED if c.file == file):
        fresh_topic(deployed)
    run_doc(deployed, file, tmp_path_factory.mktemp("DIR"))
