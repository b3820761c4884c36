"""Private Redis, RabbitMQ and PostgreSQL servers for worker and fault tests: started on a free
port, restarted and stopped by their own pid, never touching the shared servers.

    with RedisServer.started() as broker:      # redis-server --port N --save ''
        ... broker.url ... broker.restart() ...
    with RabbitNode.started() as node:          # rabbitmq-server, its own node name and folders
        ... node.url(node.fresh_vhost()) ... node.restart() ...
    with PostgresCluster.started() as cluster:  # initdb + postgres under a temporary folder
        ... cluster.url ... cluster.restart() ...

``missing_redis()`` / ``missing_rabbitmq()`` / ``missing_postgres()`` say why a server cannot be
started here (None when it can), for ``need_service``. PostgreSQL refuses to run as root, so as
root the cluster runs as the ``postgres`` user (``runuser -u postgres --``) under a folder that
user owns.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT = 30.0  # seconds a server may take to accept connections
STOP_TIMEOUT = 30.0  # seconds a shutdown may take before the server is killed
POLL_SECONDS = 0.05  # how often a start or stop is checked
POSTGRES_USER = "postgres"


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accepts(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_until(check: object, timeout: float, what: str) -> None:
    """Poll ``check()`` until it is true, or raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL_SECONDS)


def stop_pid(pid: int, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> None:
    """Signal one process we started and wait until it is gone; SIGKILL it if that hangs."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    try:
        wait_until(lambda: not _alive(pid), timeout, f"process {pid} to stop")
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not _alive(pid), timeout, f"process {pid} to die")


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        if waited == pid:
            return False
    except ChildProcessError:
        pass  # not our child (the postmaster is pg_ctl's): ask the kernel instead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and _state(pid) != "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


# --- Redis -------------------------------------------------------------------------------------


def missing_redis() -> str | None:
    """Why a private redis-server cannot be started here, or None."""
    return None if shutil.which("redis-server") else "redis-server is not on PATH"


@dataclass
class RedisServer:
    """A redis-server of our own on a free port, without persistence unless asked."""

    port: int = field(default_factory=free_port)
    password: str | None = None
    appendonly: bool = False
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="recap-redis-")))
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    @contextlib.contextmanager
    def started(cls, **options: object) -> Iterator[RedisServer]:
        server = cls(**options)  # type: ignore[arg-type]
        server.start()
        try:
            yield server
        finally:
            server.stop()
            shutil.rmtree(server.folder, ignore_errors=True)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--dir", str(self.folder), "--daemonize", "no"]
        command += ["--appendonly", "yes" if self.appendonly else "no"]
        if self.password:
            command += ["--requirepass", self.password]
        log = (self.folder / "redis.log").open("ab")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._ready, START_TIMEOUT, f"redis-server on port {self.port}")

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = (self.folder / "redis.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"redis-server exited with {self.process.returncode}: {log}")
        return accepts(self.port)

    def stop(self) -> None:
        """Stop our server by its pid (SIGTERM: a clean shutdown)."""
        if self.process is not None and self.process.poll() is None:
            stop_pid(self.process.pid)
            self.process.wait()

    def restart(self) -> None:
        """Stop and start again on the same port (queued messages survive only with AOF)."""
        self.stop()
        self.start()


# --- RabbitMQ ----------------------------------------------------------------------------------

# Distribution packages install a wrapper on PATH that re-runs the server as the ``rabbitmq`` user
# with its own environment; the script it wraps takes ours (node name, folders, ports).
RABBITMQ_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmq-server",)
RABBITMQ_USER = "guest"
RABBITMQ_PASSWORD = "guest"
RABBITMQ_VHOSTS = 24  # vhosts made at boot, one per test that needs an empty broker
RABBITMQ_START_TIMEOUT = 90.0  # an Erlang node boots in seconds, slower on a loaded machine


def rabbitmq_server_program() -> str | None:
    """The ``rabbitmq-server`` script that runs a node as the calling user, or None."""
    found = shutil.which("rabbitmq-server")
    candidates = [*RABBITMQ_SCRIPTS, *([found] if found else [])]
    for path in candidates:
        if Path(path).is_file() and not _is_su_wrapper(Path(path)):
            return str(Path(path).resolve())
    return None


def _is_su_wrapper(path: Path) -> bool:
    try:
        return b"su rabbitmq" in path.read_bytes()[:8192]
    except OSError:
        return True


def missing_rabbitmq() -> str | None:
    """Why a private RabbitMQ node cannot be started here, or None."""
    if rabbitmq_server_program() is None:
        return "rabbitmq-server is not installed (its own script, not only the su wrapper)"
    if shutil.which("erl") is None:
        return "erl (Erlang) is not on PATH"
    return None


def _password_hash(password: str) -> str:
    """RabbitMQ's salted SHA-256 password hash, as its definitions file holds it."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


@dataclass
class RabbitNode:
    """A RabbitMQ node of our own: its own node name, ports, cookie, data and log folders.

    Boot imports a definitions file: the user ``guest`` and ``RABBITMQ_VHOSTS`` empty vhosts, so a
    test takes a fresh vhost (``fresh_vhost()``) instead of sharing queues with the one before.
    Data is kept across ``restart()`` (durable queues and their messages survive it)."""

    port: int = field(default_factory=free_port)
    dist_port: int = field(default_factory=free_port)
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="recap-rabbit-")))
    process: subprocess.Popen[bytes] | None = None
    vhosts_taken: int = 0

    @classmethod
    @contextlib.contextmanager
    def started(cls, launched: RabbitNode | None = None) -> Iterator[RabbitNode]:
        """A running node (``launched``, once it is ready, or a new one), stopped and removed
        afterwards."""
        node = launched or cls()
        try:
            if node.process is None:
                node.launch()
            node.wait_ready()
            yield node
        finally:
            node.stop()
            shutil.rmtree(node.folder, ignore_errors=True)

    @property
    def name(self) -> str:
        return f"rabbit-test-{self.port}@localhost"

    def url(self, vhost: str = "/") -> str:
        path = "/" if vhost == "/" else f"/{vhost}"
        return f"amqp://{RABBITMQ_USER}:{RABBITMQ_PASSWORD}@127.0.0.1:{self.port}{path}"

    def fresh_vhost(self) -> str:
        """A vhost no test has used yet on this node."""
        if self.vhosts_taken >= RABBITMQ_VHOSTS:
            raise RuntimeError(f"all {RABBITMQ_VHOSTS} test vhosts of this node are taken")
        self.vhosts_taken += 1
        return f"t{self.vhosts_taken:02d}"

    def write_files(self) -> None:
        vhosts = ["/", *(f"t{n:02d}" for n in range(1, RABBITMQ_VHOSTS + 1))]
        definitions = {
            "users": [
                {
                    "name": RABBITMQ_USER,
                    "password_hash": _password_hash(RABBITMQ_PASSWORD),
                    "hashing_algorithm": "rabbit_password_hashing_sha256",
                    "tags": ["administrator"],
                }
            ],
            "vhosts": [{"name": name} for name in vhosts],
            "permissions": [
                {
                    "user": RABBITMQ_USER,
                    "vhost": name,
                    "configure": ".*",
                    "write": ".*",
                    "read": ".*",
                }
                for name in vhosts
            ],
        }
        (self.folder / "definitions.json").write_text(json.dumps(definitions))
        config = [
            f"listeners.tcp.1 = 127.0.0.1:{self.port}",
            "loopback_users = none",
            f"load_definitions = {self.folder / 'definitions.json'}",
            "log.console = false",
            "log.file.level = warning",
        ]
        (self.folder / "rabbitmq.conf").write_text("\n".join(config) + "\n")
        (self.folder / "rabbitmq-env.conf").write_text("")  # not the machine's env file
        (self.folder / "enabled_plugins").write_text("[].\n")
        cookie = self.folder / ".erlang.cookie"
        cookie.write_text(base64.b32encode(os.urandom(20)).decode())
        cookie.chmod(0o400)

    def environment(self) -> dict[str, str]:
        folder = self.folder
        values = {
            "HOME": str(folder),  # the node's Erlang cookie is ours, not the machine's
            "RABBITMQ_CONF_ENV_FILE": str(folder / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq.conf"),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(folder / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(folder / "node.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL"))}
        return {**inherited, **values}

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the node without waiting for it (the test run boots it while other tests run)."""
        program = rabbitmq_server_program()
        assert program is not None, missing_rabbitmq()
        if not (self.folder / "rabbitmq.conf").exists():
            self.write_files()
        log = (self.folder / "server.log").open("ab")
        self.process = subprocess.Popen(
            [program],
            env=self.environment(),
            cwd=self.folder,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self) -> None:
        wait_until(self._ready, RABBITMQ_START_TIMEOUT, f"RabbitMQ node {self.name}")

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = (self.folder / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"rabbitmq-server exited with {self.process.returncode}: {log}")
        return accepts(self.port)

    def _vm_pid(self) -> int | None:
        try:
            return int((self.folder / "node.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Stop our node: SIGTERM to its start script, which stops the Erlang VM cleanly; the
        VM itself (by the pid it wrote) if it outlives the script."""
        if self.process is None:
            return
        vm = self._vm_pid()
        if self.process.poll() is None:
            stop_pid(self.process.pid)
        self.process.wait()
        if vm is not None:
            stop_pid(vm)
        (self.folder / "node.pid").unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop and start again on the same ports; durable queues keep their messages."""
        self.stop()
        self.start()


# --- PostgreSQL --------------------------------------------------------------------------------


def _as_postgres() -> list[str]:
    """The prefix that runs a PostgreSQL program as a non-root user."""
    return ["runuser", "-u", POSTGRES_USER, "--"] if os.geteuid() == 0 else []


def missing_postgres() -> str | None:
    """Why a private PostgreSQL cluster cannot be started here, or None."""
    for program in ("initdb", "pg_ctl", "postgres"):
        if shutil.which(program) is None:
            return f"{program} is not on PATH"
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root and runuser is not available"
        try:
            import pwd

            pwd.getpwnam(POSTGRES_USER)
        except KeyError:
            return f"running as root and there is no {POSTGRES_USER!r} user"
    return None


@dataclass
class PostgresCluster:
    """A PostgreSQL cluster of our own (initdb) on a free port, trust authentication."""

    port: int = field(default_factory=free_port)
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="recap-pg-")))
    pid: int | None = None

    @classmethod
    @contextlib.contextmanager
    def started(cls) -> Iterator[PostgresCluster]:
        cluster = cls()
        try:
            cluster.init()
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
            shutil.rmtree(cluster.folder, ignore_errors=True)

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{POSTGRES_USER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *command: str) -> None:
        done = subprocess.run(
            [*_as_postgres(), *command], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stderr.strip() or done.stdout}")

    def init(self) -> None:
        if os.geteuid() == 0:
            import pwd

            user = pwd.getpwnam(POSTGRES_USER)
            os.chown(self.folder, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", POSTGRES_USER, "-A", "trust", "-E", "UTF8")

    def start(self) -> None:
        """``pg_ctl start`` and wait; the postmaster's pid comes from its pid file."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off"
        log = str(self.folder / "postgres.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        wait_until(lambda: accepts(self.port), START_TIMEOUT, f"PostgreSQL on port {self.port}")

    def create_database(self, name: str) -> str:
        """A new database in this cluster; its SQLAlchemy URL."""
        from sqlalchemy import create_engine, text

        admin = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        return self.url(name)

    def stop(self, sig: int = signal.SIGINT) -> None:
        """Stop our postmaster by its pid (SIGINT: a fast shutdown that drops sessions)."""
        if self.pid is not None:
            stop_pid(self.pid, sig)
            self.pid = None

    def restart(self) -> None:
        self.stop()
        self.start()
