"""Private Redis, RabbitMQ and PostgreSQL servers for the tests: started on a free
port, restarted and stopped by their own pid, never touching a machine's own servers.

    with RedisServer.started() as broker:      # redis-server --port N --save ''
        ... broker.url ... broker.restart() ...
    with RabbitNode.started() as node:          # rabbitmq-server, its own node name and folders
        ... node.url(node.fresh_vhost()) ... node.restart() ...
    with PostgresCluster.started() as cluster:  # initdb + postgres under a temporary folder
        ... cluster.url ... cluster.restart() ...

All three are a ``PrivateServer``: a free port, a folder of their own, ready when the port
accepts, stopped by pid, restarted on the same port. ``redis_database(url)`` is the other way
to a broker of one's own: a database number of a Redis server (the test run's, or a benchmark's)
that no concurrent run uses or flushes while it is held.

``missing_redis()`` / ``missing_rabbitmq()`` / ``missing_postgres()`` say why a server cannot be
started here (None when it can), for ``need_service``. PostgreSQL refuses to run as root, so as
root the cluster runs as the ``postgres`` user (``runuser -u postgres --``) under a folder that
user owns.

``SUITE`` holds the PostgreSQL and Redis servers of one test run (``SuiteServers``): the ones
``RECAP_TEST_POSTGRES_URL`` / ``RECAP_TEST_REDIS_URL`` name, else private ones started on first use
and stopped when the run ends; ``need_service`` skips a test whose service is missing, or fails it
under ``CI=true``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, NoReturn, Self
from urllib.parse import urlsplit, urlunsplit

from tests.support.processes import WaitTimeout, accepts, free_port, wait_for

START_TIMEOUT = 30.0  # seconds a server may take to accept connections
STOP_TIMEOUT = 30.0  # seconds a shutdown may take before the server is killed
LOG_TAIL_CHARS = 2_000  # how much of a server's log an early exit quotes
POSTGRES_USER = "postgres"

__all__ = ["accepts", "free_port"]  # re-exported: tests import them from here


def stop_pid(pid: int, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> None:
    """Signal one process we started and wait until it is gone; SIGKILL it if that hangs."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    try:
        wait_for(lambda: not _alive(pid), timeout, f"process {pid} to stop")
    except WaitTimeout:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not _alive(pid), timeout, f"process {pid} to die")


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


def _folder(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


@dataclass
class PrivateServer:
    """What every server of our own shares: a free port, a temporary folder holding its data and
    its log, a child process started there, "ready" meaning it accepts connections on its port,
    a stop by its own pid, and a restart on the same port. A subclass says how to ``launch``.

        with SomeServer.started() as server:  # launched, ready; stopped and removed after
            ...
    """

    port: int = field(default_factory=free_port)
    folder: Path = field(default_factory=lambda: _folder("recap-server-"))
    process: subprocess.Popen[bytes] | None = None

    kind: ClassVar[str] = "server"
    log_name: ClassVar[str] = "server.log"
    start_timeout: ClassVar[float] = START_TIMEOUT

    @classmethod
    @contextlib.contextmanager
    def started(cls, launched: Self | None = None, **options: object) -> Iterator[Self]:
        """A running server (``launched``, once it is ready, or a new one made with
        ``options``), stopped and its folder removed afterwards."""
        server = launched or cls(**options)  # type: ignore[arg-type]
        try:
            if not server.launched:
                server.launch()
            server.wait_ready()
            yield server
        finally:
            server.remove()

    @property
    def launched(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def log(self) -> Path:
        return self.folder / self.log_name

    def launch(self) -> None:
        """Start the server without waiting for it."""
        raise NotImplementedError

    def spawn(self, command: list[str], env: dict[str, str] | None = None) -> None:
        """Run the server's program in its folder, its output appended to its log."""
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                command,
                env=env,
                cwd=self.folder,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

    def ready(self) -> bool:
        """Whether the server accepts connections; an error if its process has exited."""
        if self.process is not None and self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
            raise RuntimeError(f"{self.kind} exited with {self.process.returncode}: {tail}")
        return accepts(self.port)

    def wait_ready(self) -> None:
        wait_for(self.ready, self.start_timeout, f"{self.kind} on port {self.port}")

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def stop(self) -> None:
        """Stop our server by its pid (SIGTERM: a clean shutdown)."""
        if self.process is not None and self.process.poll() is None:
            stop_pid(self.process.pid)
            self.process.wait()

    def restart(self) -> None:
        """Stop and start again on the same port, with the same folder."""
        self.stop()
        self.start()

    def remove(self) -> None:
        """Stop the server and delete its folder."""
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


# --- Redis -------------------------------------------------------------------------------------


def missing_redis() -> str | None:
    """Why a private redis-server cannot be started here, or None."""
    return None if shutil.which("redis-server") else "redis-server is not on PATH"


@dataclass
class RedisServer(PrivateServer):
    """A redis-server of our own on a free port, without persistence unless asked."""

    password: str | None = None
    appendonly: bool = False
    folder: Path = field(default_factory=lambda: _folder("recap-redis-"))

    kind: ClassVar[str] = "redis-server"
    log_name: ClassVar[str] = "redis.log"

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def launch(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--dir", str(self.folder), "--daemonize", "no"]
        command += ["--appendonly", "yes" if self.appendonly else "no"]
        if self.password:
            command += ["--requirepass", self.password]
        self.spawn(command)

    def restart(self) -> None:
        """Stop and start again on the same port (queued messages survive only with AOF)."""
        super().restart()


# A database number of a Redis server that a test run holds alone: claimed with an
# expiring SET NX in database 0 (a crashed run's claim lapses), emptied when taken and when let go.
REDIS_DATABASES = range(1, 8)  # 8-15 are left to code that picks one of them at random
REDIS_CLAIM_PREFIX = "recap-test:database:"
REDIS_CLAIM_SECONDS = 3_600  # longer than any test holds one
REDIS_CLAIM_TIMEOUT = 120.0  # seconds to wait for a number when concurrent runs hold them all


def _with_database(url: str, number: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{number}"))


@contextlib.contextmanager
def redis_database(url: str) -> Iterator[str]:
    """The URL of a database on the Redis server at ``url`` that no concurrent test run or
    benchmark uses or flushes while this one holds it; emptied before and after."""
    import redis

    claims = redis.Redis.from_url(_with_database(url, 0))
    token = uuid.uuid4().hex

    def claim() -> int | None:
        for number in REDIS_DATABASES:
            key = f"{REDIS_CLAIM_PREFIX}{number}"
            if claims.set(key, token, nx=True, ex=REDIS_CLAIM_SECONDS):
                return number
        return None

    number = wait_for(claim, REDIS_CLAIM_TIMEOUT, "a free Redis test database", poll=0.5)
    private = _with_database(url, number)
    client = redis.Redis.from_url(private)
    try:
        client.flushdb()
        yield private
    finally:
        client.flushdb()
        client.close()
        key = f"{REDIS_CLAIM_PREFIX}{number}"
        if claims.get(key) == token.encode():
            claims.delete(key)
        claims.close()


# --- RabbitMQ ----------------------------------------------------------------------------------

# Distribution packages install a wrapper on PATH that re-runs the server as the ``rabbitmq`` user
# with its own environment; the script it wraps takes ours (node name, folders, ports).
RABBITMQ_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmq-server",)
RABBITMQ_USER = "guest"
RABBITMQ_PASSWORD = "guest"
RABBITMQ_VHOSTS = 64  # vhosts made at boot, one per test that needs an empty broker (over 24 do)
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
class RabbitNode(PrivateServer):
    """A RabbitMQ node of our own: its own node name, ports, cookie, data and log folders.

    Boot imports a definitions file: the user ``guest`` and ``RABBITMQ_VHOSTS`` empty vhosts, so a
    test takes a fresh vhost (``fresh_vhost()``) instead of sharing queues with the one before.
    Data is kept across ``restart()`` (durable queues and their messages survive it)."""

    dist_port: int = field(default_factory=free_port)
    folder: Path = field(default_factory=lambda: _folder("recap-rabbit-"))
    vhosts_taken: int = 0

    kind: ClassVar[str] = "rabbitmq-server"
    start_timeout: ClassVar[float] = RABBITMQ_START_TIMEOUT

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

    def launch(self) -> None:
        """Start the node without waiting for it (the test run boots it while other tests run)."""
        program = rabbitmq_server_program()
        assert program is not None, missing_rabbitmq()
        if not (self.folder / "rabbitmq.conf").exists():
            self.write_files()
        self.spawn([program], env=self.environment())

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
        super().stop()
        if vm is not None:
            stop_pid(vm)
        (self.folder / "node.pid").unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop and start again on the same ports; durable queues keep their messages."""
        super().restart()


# --- PostgreSQL --------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_database(admin_url: str, prefix: str = "recap_test_") -> Iterator[str]:
    """A fresh, empty database on the PostgreSQL server of ``admin_url``; its URL. Dropped
    afterwards (with the sessions still open on it)."""
    from sqlalchemy import create_engine, text

    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield admin_url.rsplit("/", 1)[0] + f"/{name}"
        finally:
            from recap.core.storage.db import dispose_engines

            dispose_engines()
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


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
class PostgresCluster(PrivateServer):
    """A PostgreSQL cluster of our own (initdb) on a free port, trust authentication. ``pg_ctl``
    starts the postmaster (not our child), so it is stopped by the pid in its pid file."""

    folder: Path = field(default_factory=lambda: _folder("recap-pg-"))
    postmaster: int | None = None

    kind: ClassVar[str] = "PostgreSQL"
    log_name: ClassVar[str] = "postgres.log"

    @property
    def launched(self) -> bool:
        return self.postmaster is not None

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

    def launch(self) -> None:
        """``initdb`` the first time, then ``pg_ctl start`` (it waits); the postmaster's pid
        comes from its pid file."""
        if not self.data.exists():
            self.init()
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off"
        log = str(self.log)
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")
        self.postmaster = int((self.data / "postmaster.pid").read_text().split()[0])

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
        if self.postmaster is not None:
            stop_pid(self.postmaster, sig)
            self.postmaster = None


# --- The suite's servers -----------------------------------------------------------------------

POSTGRES_SETTING = "RECAP_TEST_POSTGRES_URL"  # a running server the suite may use instead
REDIS_SETTING = "RECAP_TEST_REDIS_URL"
IN_CI = os.environ.get("CI", "").lower() == "true"


def need_service(name: str, reason: str) -> NoReturn:
    """Skip for a missing service, or fail under CI=true."""
    import pytest

    message = f"{name} is not available ({reason})"
    if IN_CI:
        pytest.fail(f"{message}; under CI=true this is a failure, not a skip")
    pytest.skip(message)


def need_redis_server() -> None:
    """Skip (fail under CI=true) where a Redis server of the test's own cannot be started."""
    problem = missing_redis()
    if problem is not None:
        need_service("redis-server", problem)


class Unavailable(Exception):
    """A server the suite cannot have here; the message says why."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def postgres_problem(url: str) -> str | None:
    """Why the PostgreSQL server at ``url`` cannot be used, or None when it answers."""
    from sqlalchemy import create_engine, text

    try:
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(text("select 1"))
        finally:
            engine.dispose()
    except Exception as exc:  # any failure to connect means the server is not usable here
        return _first_line(exc)
    return None


def redis_problem(url: str) -> str | None:
    """Why the Redis server at ``url`` cannot be used, or None when it answers."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # any failure to reach Redis means it is not usable here
        return _first_line(exc)
    return None


@dataclass
class SuiteServers:
    """The PostgreSQL and Redis servers of one test run, each found once on first use: the server
    its ``RECAP_TEST_*_URL`` names when that is set (a machine's running server, used only when
    asked), else a private one started here (``PostgresCluster``, ``RedisServer``) when its
    programs are on PATH, stopped by its pid when the run ends. The URL, or why there is none, is
    kept for the rest of the run."""

    postgres: PostgresCluster | None = None
    redis: RedisServer | None = None
    found: dict[str, str | Unavailable] = field(default_factory=dict)

    def postgres_admin_url(self) -> str:
        """A URL of the PostgreSQL server on which the suite creates its databases."""
        return self._once("postgres", self._postgres)

    def redis_url(self) -> str:
        """The URL of the Redis server (database 0) the suite's brokers use."""
        return self._once("redis", self._redis)

    def _once(self, name: str, find: Callable[[], str]) -> str:
        if name not in self.found:
            try:
                self.found[name] = find()
            except Unavailable as exc:
                self.found[name] = exc
        answer = self.found[name]
        if isinstance(answer, Unavailable):
            raise answer
        return answer

    def _postgres(self) -> str:
        given = os.environ.get(POSTGRES_SETTING)
        if given:
            problem = postgres_problem(given)
            if problem is not None:
                raise Unavailable(f"{POSTGRES_SETTING}: {problem}")
            return given
        problem = missing_postgres()
        if problem is not None:
            raise Unavailable(f"{problem} and {POSTGRES_SETTING} is not set")
        cluster = PostgresCluster()
        try:
            cluster.start()
        except Exception as exc:  # a cluster that cannot start here is a missing service
            cluster.remove()
            raise Unavailable(f"a private PostgreSQL did not start: {_first_line(exc)}") from exc
        self.postgres = cluster
        return cluster.url()

    def _redis(self) -> str:
        given = os.environ.get(REDIS_SETTING)
        if given:
            problem = redis_problem(given)
            if problem is not None:
                raise Unavailable(f"{REDIS_SETTING}: {problem}")
            return given
        problem = missing_redis()
        if problem is not None:
            raise Unavailable(f"{problem} and {REDIS_SETTING} is not set")
        server = RedisServer()
        try:
            server.start()
        except Exception as exc:  # a server that cannot start here is a missing service
            server.remove()
            raise Unavailable(f"a private redis-server did not start: {_first_line(exc)}") from exc
        self.redis = server
        return server.url

    def stop(self) -> None:
        """Stop and remove the private servers started here (never a server the settings name)."""
        for server in (self.postgres, self.redis):
            if server is not None:
                server.remove()
        self.postgres = self.redis = None
        self.found.clear()


SUITE = SuiteServers()  # the test run's servers; conftest stops them when the run ends
