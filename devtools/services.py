"""Local, real services on loopback for development, tests and the demo.

``python -m devtools.services up|down|status|env`` starts MariaDB, PostgreSQL 15 and ZooKeeper from
the Debian packages, each with data under ``$DBLOG_HOME`` (default ``.dblog/``) and its
own port, never touching a system-wide instance. ``up`` is idempotent.

Ports: ``DBLOG_MARIADB_PORT`` (13306), ``DBLOG_PG_PORT`` (15432), ``DBLOG_ZK_PORT`` (12181).
Passwords: ``DBLOG_MARIADB_PASSWORD`` / ``DBLOG_PG_PASSWORD`` when set, else generated once and
kept in ``$DBLOG_HOME/secrets.json`` (mode 0600); ``python -m devtools.services env`` prints them as
``export`` lines for a shell.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dblog.app.paths import dblog_home
from dblog.core.errors import ServiceError

PG_BIN = Path("/usr/lib/postgresql/15/bin")
ZK_CLASSPATH = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"
START_TIMEOUT_S = 60.0

PIPELINE_USER = "dblog"


@dataclass(frozen=True)
class Endpoints:
    """Where the local services listen, and the pipeline user's credentials."""

    mariadb_port: int
    pg_port: int
    zk_port: int
    mariadb_password: str
    pg_password: str
    host: str = "127.0.0.1"
    user: str = PIPELINE_USER

    @property
    def zk_hosts(self) -> str:
        return f"{self.host}:{self.zk_port}"


def _port(env: str, default: int) -> int:
    raw = os.environ.get(env, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise ServiceError(f"{env}={raw!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise ServiceError(f"{env}={value} is not a port number (1-65535)")
    return value


def _secrets(home: Path) -> dict[str, str]:
    path = home / "secrets.json"
    stored: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    changed = False
    for name in ("mariadb", "pg"):
        if name not in stored:
            stored[name] = secrets.token_urlsafe(18)
            changed = True
    if changed:
        home.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored))
        path.chmod(0o600)
    return stored


def endpoints(home: Path | None = None) -> Endpoints:
    """The endpoints of the local services (ports and passwords, see module docstring)."""
    home = home or dblog_home()
    stored = _secrets(home)
    return Endpoints(
        mariadb_port=_port("DBLOG_MARIADB_PORT", 13306),
        pg_port=_port("DBLOG_PG_PORT", 15432),
        zk_port=_port("DBLOG_ZK_PORT", 12181),
        mariadb_password=os.environ.get("DBLOG_MARIADB_PASSWORD", stored["mariadb"]),
        pg_password=os.environ.get("DBLOG_PG_PASSWORD", stored["pg"]),
    )


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _pid_alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    if _is_zombie(pid):
        # Killed but not yet reaped (a child of this process, e.g. a test's ensemble node):
        # it is gone, and `up` must start it again rather than wait for it.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return None
    return pid


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(") ", 1)[-1][:1] == "Z"


def _need_binary(path: str, package: str) -> str:
    found = shutil.which(path) if "/" not in path else (path if Path(path).exists() else None)
    if not found:
        raise ServiceError(
            f"{path} not found: install the Debian package {package} (run `make setup`)"
        )
    return found


def _wait(
    what: str, check: Callable[[], bool], log: Path, timeout: float = START_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    tail = log.read_text(errors="replace").splitlines()[-5:] if log.exists() else []
    raise ServiceError(f"{what} did not become healthy in {timeout:.0f}s; log {log}: {tail}")


def _check_port_free(name: str, port: int, env: str) -> None:
    if _port_open(port):
        raise ServiceError(
            f"{name}: port {port} is already in use by another process; "
            f"stop it or choose another port with {env}=..."
        )


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


class Service:
    """One local service: start, stop, health."""

    name: str = ""
    port_env: str = ""

    def __init__(self, home: Path, ep: Endpoints) -> None:
        self.home = home
        self.ep = ep
        self.dir = home / self.name
        self.log = home / "logs" / f"{self.name}.log"

    @property
    def port(self) -> int:
        raise NotImplementedError

    @property
    def pid_file(self) -> Path:
        return self.dir / "run.pid"

    def running(self) -> bool:
        return _pid_alive(self.pid_file) is not None

    def healthy(self) -> bool:
        raise NotImplementedError

    def up(self) -> str:
        if self.running():
            if not self.healthy():
                _wait(self.name, self.healthy, self.log)
            return f"{self.name}: already running on 127.0.0.1:{self.port}"
        _check_port_free(self.name, self.port, self.port_env)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._start()
        _wait(self.name, self.healthy, self.log)
        self._after_start()
        return f"{self.name}: started on 127.0.0.1:{self.port}"

    def down(self) -> str:
        pid = _pid_alive(self.pid_file)
        if pid is None:
            return f"{self.name}: not running"
        self._stop(pid)
        return f"{self.name}: stopped"

    def status(self) -> str:
        if not self.running():
            return f"{self.name}: stopped"
        state = "healthy" if self.healthy() else "NOT healthy"
        return f"{self.name}: running on 127.0.0.1:{self.port}, {state}"

    def _start(self) -> None:
        raise NotImplementedError

    def _after_start(self) -> None:
        pass

    def _stop(self, pid: int) -> None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _pid_alive(self.pid_file) == pid:
            time.sleep(0.2)
        if _pid_alive(self.pid_file) == pid:
            os.kill(pid, signal.SIGKILL)

    def _spawn(self, argv: list[str]) -> int:
        with self.log.open("ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return proc.pid


class MariaDB(Service):
    name = "mariadb"
    port_env = "DBLOG_MARIADB_PORT"

    @property
    def port(self) -> int:
        return self.ep.mariadb_port

    @property
    def socket_path(self) -> Path:
        return self.dir / "mysqld.sock"

    @property
    def cnf(self) -> Path:
        return self.dir / "my.cnf"

    def _write_cnf(self) -> None:
        data = self.dir / "data"
        self.cnf.write_text(
            "[mariadbd]\n"
            f"datadir={data}\nsocket={self.socket_path}\nport={self.port}\n"
            f"pid-file={self.pid_file}\nbind-address=127.0.0.1\nuser=root\n"
            "skip-name-resolve\nserver-id=1\n"
            f"log-bin={data}/mysql-bin\nbinlog_format=ROW\nbinlog_row_image=FULL\n"
            "binlog_row_metadata=FULL\nexpire_logs_days=7\n"
            "character-set-server=utf8mb4\ncollation-server=utf8mb4_unicode_ci\n"
            "innodb_buffer_pool_size=256M\ninnodb_flush_log_at_trx_commit=2\nsync_binlog=0\n"
            "max_connections=300\n"
            f"log-error={self.log}\n"
        )

    def _start(self) -> None:
        mariadbd = _need_binary("mariadbd", "mariadb-server")
        install_db = _need_binary("mariadb-install-db", "mariadb-server")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_cnf()
        if not (self.dir / "data" / "mysql").exists():
            result = subprocess.run(
                [install_db, f"--defaults-file={self.cnf}", "--user=root",
                 "--auth-root-authentication-method=socket", "--skip-test-db"],
                capture_output=True, text=True,
            )
            if result.returncode != 0:
                raise ServiceError(f"mariadb-install-db failed: {result.stderr.strip()[-300:]}")
        self._spawn([mariadbd, f"--defaults-file={self.cnf}"])

    def root_sql(self, sql: str) -> str:
        """Run SQL as the local root over the unix socket (set-up only)."""
        client = _need_binary("mariadb", "mariadb-client")
        result = subprocess.run(
            [client, "--protocol=socket", f"--socket={self.socket_path}", "-uroot", "-N",
             "-e", sql],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise ServiceError(f"mariadb: {result.stderr.strip()}")
        return result.stdout

    def healthy(self) -> bool:
        if not self.socket_path.exists():
            return False
        try:
            self.root_sql("SELECT 1")
        except ServiceError:
            return False
        return True

    def _after_start(self) -> None:
        import pymysql

        conn = pymysql.connect(unix_socket=str(self.socket_path), user="root", autocommit=True)
        try:
            with conn.cursor() as cur:
                user = (self.ep.user, "127.0.0.1")
                cur.execute("CREATE USER IF NOT EXISTS %s@%s IDENTIFIED BY %s",
                            (*user, self.ep.mariadb_password))
                cur.execute("ALTER USER %s@%s IDENTIFIED BY %s", (*user, self.ep.mariadb_password))
                cur.execute("GRANT ALL PRIVILEGES ON *.* TO %s@%s WITH GRANT OPTION", user)
        finally:
            conn.close()


class Postgres(Service):
    name = "postgres"
    port_env = "DBLOG_PG_PORT"

    @property
    def port(self) -> int:
        return self.ep.pg_port

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def pid_file(self) -> Path:
        return self.data / "postmaster.pid"

    def _run(self, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(_as_postgres() + argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload, no-any-return]

    def _start(self) -> None:
        _need_binary(str(PG_BIN / "initdb"), "postgresql-15")
        if not Path("/usr/lib/postgresql/15/lib/wal2json.so").exists():
            raise ServiceError("wal2json not found: install postgresql-15-wal2json (make setup)")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "run").mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            shutil.chown(self.dir / "run", "postgres", "postgres")
            self.home.chmod(self.home.stat().st_mode | 0o011)
            self.log.parent.chmod(0o777)
        if not (self.data / "PG_VERSION").exists():
            pwfile = self.dir / "pwfile"
            pwfile.write_text(self.ep.pg_password + "\n")
            pwfile.chmod(0o600)
            if os.geteuid() == 0:
                shutil.chown(pwfile, "postgres", "postgres")
            result = self._run([
                str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                "--auth-local=peer", "--auth-host=scram-sha-256", f"--pwfile={pwfile}",
                "-E", "UTF8", "--locale=C.UTF-8",
            ])
            pwfile.unlink()
            if result.returncode != 0:
                raise ServiceError(f"initdb failed: {result.stderr.strip()[-300:]}")
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write(
                    "\n# dblog-delta local service\n"
                    "listen_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{self.dir / 'run'}'\n"
                    "wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n"
                    "shared_buffers = 128MB\nfsync = off\nsynchronous_commit = off\n"
                )
        self.log.touch()
        if os.geteuid() == 0:
            shutil.chown(self.log, "postgres", "postgres")
        result = self._run([
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
            "-o", f"-p {self.port}", "-w", "-t", "60", "start",
        ])
        if result.returncode != 0:
            raise ServiceError(f"pg_ctl start failed: {(result.stderr or result.stdout).strip()}")

    def psql(self, sql: str, db: str = "postgres") -> str:
        """Run SQL as the local superuser over the unix socket (set-up only)."""
        result = self._run([
            str(PG_BIN / "psql"), "-h", str(self.dir / "run"), "-p", str(self.port),
            "-U", "postgres", "-d", db, "-v", "ON_ERROR_STOP=1", "-Atc", sql,
        ])
        if result.returncode != 0:
            raise ServiceError(f"postgres: {result.stderr.strip()}")
        return str(result.stdout)

    def healthy(self) -> bool:
        result = self._run([
            str(PG_BIN / "pg_isready"), "-h", str(self.dir / "run"), "-p", str(self.port),
        ])
        return result.returncode == 0

    def _after_start(self) -> None:
        # The password reaches psql through its environment and :'pw' quoting: it is in
        # neither the SQL text nor the process list.
        sql = (
            "\\getenv pw DBLOG_PG_NEW_PASSWORD\n"
            "SELECT format('%s ROLE %I WITH LOGIN REPLICATION SUPERUSER PASSWORD %L',"
            " CASE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'user')"
            " THEN 'ALTER' ELSE 'CREATE' END, :'user', :'pw') \\gexec\n"
        )
        result = subprocess.run(
            _as_postgres() + [
                str(PG_BIN / "psql"), "-h", str(self.dir / "run"), "-p", str(self.port),
                "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-q",
                "-v", f"user={self.ep.user}", "-f", "-",
            ],
            input=sql, capture_output=True, text=True,
            env={**os.environ, "DBLOG_PG_NEW_PASSWORD": self.ep.pg_password},
        )
        if result.returncode != 0:
            raise ServiceError(
                f"postgres: creating the pipeline role failed: {result.stderr.strip()}"
            )

    def _stop(self, pid: int) -> None:
        self.stop_now("fast")

    def stop_now(self, mode: str) -> None:
        """``pg_ctl stop -m MODE``: ``fast`` (clients disconnected, a checkpoint) or
        ``immediate`` (no checkpoint: the next start recovers from the WAL, as after a
        crash)."""
        self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"])


class ZooKeeper(Service):
    name = "zookeeper"
    port_env = "DBLOG_ZK_PORT"

    @property
    def port(self) -> int:
        return self.ep.zk_port

    def _start(self) -> None:
        java = _need_binary("java", "openjdk-17-jre-headless")
        if not Path("/usr/share/java/zookeeper.jar").exists():
            raise ServiceError("ZooKeeper not found: install the Debian package zookeeper")
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "zoo.cfg"
        cfg.write_text(
            f"dataDir={self.dir / 'data'}\nclientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\ntickTime=2000\ninitLimit=10\nsyncLimit=5\n"
            "maxClientCnxns=200\nadmin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n"
            "autopurge.purgeInterval=1\n"
        )
        pid = self._spawn([
            java, "-Xmx256m", "-Dzookeeper.log.dir=" + str(self.log.parent),
            "-Dzookeeper.root.logger=INFO,CONSOLE", "-cp", ZK_CLASSPATH,
            "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg),
        ])
        self.pid_file.write_text(str(pid))

    def four_letters(self, command: str) -> str:
        """The reply to a ZooKeeper four-letter command ('' if the node does not answer)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(command.encode())
                chunks = []
                while chunk := sock.recv(4096):
                    chunks.append(chunk)
                return b"".join(chunks).decode(errors="replace")
        except OSError:
            return ""

    def healthy(self) -> bool:
        return self.four_letters("ruok") == "imok"

    def requests_received(self) -> int | None:
        """The requests the node received since it started (its ``srvr`` reply: every
        client's, pings included); None if it does not answer."""
        for line in self.four_letters("srvr").splitlines():
            if line.startswith("Received:"):
                return int(line.split(":", 1)[1])
        return None


SERVICES: tuple[type[Service], ...] = (MariaDB, Postgres, ZooKeeper)

ENSEMBLE_NODES = 3


def ensemble_ports(index: int) -> tuple[int, int, int]:
    """Client, peer and election ports of ensemble node ``index`` (1-based): from
    ``$DBLOG_ZK_ENSEMBLE_PORT`` (12281) on, in steps of one per node and ten per kind."""
    base = _port("DBLOG_ZK_ENSEMBLE_PORT", 12281)
    return base + index - 1, base + 10 + index - 1, base + 20 + index - 1


def ensemble_hosts() -> str:
    """The ensemble's connection string (``host:port,...``)."""
    return ",".join(f"127.0.0.1:{ensemble_ports(i)[0]}" for i in range(1, ENSEMBLE_NODES + 1))


class ZooKeeperNode(ZooKeeper):
    """Node ``index`` of a local 3-node ZooKeeper ensemble (``services up --zk-nodes 3``),
    beside the standalone ZooKeeper, for tests of a quorum losing a node."""

    port_env = "DBLOG_ZK_ENSEMBLE_PORT"

    def __init__(self, home: Path, ep: Endpoints, index: int) -> None:
        super().__init__(home, ep)
        self.index = index
        self.name = f"zookeeper-{index}"
        self.dir = home / "zookeeper-ensemble" / f"node{index}"
        self.log = home / "logs" / f"zookeeper-{index}.log"

    @property
    def port(self) -> int:
        return ensemble_ports(self.index)[0]

    def _start(self) -> None:
        java = _need_binary("java", "openjdk-17-jre-headless")
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{self.index}\n")
        servers = "".join(
            f"server.{i}=127.0.0.1:{ensemble_ports(i)[1]}:{ensemble_ports(i)[2]}\n"
            for i in range(1, ENSEMBLE_NODES + 1))
        cfg = self.dir / "zoo.cfg"
        cfg.write_text(
            f"dataDir={data}\nclientPort={self.port}\nclientPortAddress=127.0.0.1\n"
            "tickTime=2000\ninitLimit=10\nsyncLimit=5\nmaxClientCnxns=200\n"
            "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,cons\n"
            "autopurge.purgeInterval=1\n" + servers
        )
        pid = self._spawn([
            java, "-Xmx128m", "-Dzookeeper.log.dir=" + str(self.log.parent),
            "-Dzookeeper.root.logger=INFO,CONSOLE", "-cp", ZK_CLASSPATH,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg),
        ])
        self.pid_file.write_text(str(pid))

    def healthy(self) -> bool:
        """Serving: in a quorum, as its leader or a follower."""
        return "Mode: leader" in (reply := self.four_letters("srvr")) or \
            "Mode: follower" in reply

    def up(self) -> str:
        # Nodes start together: one alone has no quorum and is never healthy.
        if self.running():
            return f"{self.name}: already running on 127.0.0.1:{self.port}"
        _check_port_free(self.name, self.port, self.port_env)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._start()
        return f"{self.name}: started on 127.0.0.1:{self.port}"


def ensemble(home: Path | None = None) -> list[ZooKeeperNode]:
    """The local ensemble's nodes (running or not)."""
    home = home or dblog_home()
    ep = endpoints(home)
    return [ZooKeeperNode(home, ep, i) for i in range(1, ENSEMBLE_NODES + 1)]


def ensemble_up(home: Path | None = None) -> list[str]:
    """Start the ensemble's stopped nodes, then wait until every node serves."""
    nodes = ensemble(home)
    lines = [node.up() for node in nodes]
    for node in nodes:
        _wait(node.name, node.healthy, node.log)
    return lines


def _all(home: Path | None = None) -> list[Service]:
    home = home or dblog_home()
    ep = endpoints(home)
    return [cls(home, ep) for cls in SERVICES]


class SparkStandalone:
    """A Spark standalone master and one worker on loopback, started from the pyspark
    distribution's own launch classes (``bin/spark-class``): ``spark://127.0.0.1:<port>``
    (``$DBLOG_SPARK_CLUSTER_PORT``, 17077) for ``spark.master`` / ``$DBLOG_SPARK_MASTER``."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or dblog_home()
        self.dir = self.home / "spark-cluster"
        self.port = _port("DBLOG_SPARK_CLUSTER_PORT", 17077)
        self.master_url = f"spark://127.0.0.1:{self.port}"

    def _spark_class(self) -> str:
        import pyspark

        path = Path(pyspark.__file__).parent / "bin" / "spark-class"
        if not path.exists():
            raise ServiceError(f"{path} not found: reinstall pyspark (make setup)")
        return str(path)

    def _spawn(self, role: str, argv: list[str]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        log = self.home / "logs" / f"spark-{role}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
               "SPARK_WORKER_DIR": str(self.dir / "work")}
        with log.open("ab") as out:
            proc = subprocess.Popen([self._spark_class(), *argv], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env)
        (self.dir / f"{role}.pid").write_text(str(proc.pid))

    def _alive(self, role: str) -> bool:
        return _pid_alive(self.dir / f"{role}.pid") is not None

    def workers(self) -> int:
        """Workers registered with the master (from its JSON status page)."""
        import urllib.request

        try:
            with urllib.request.urlopen(  # noqa: S310 - a fixed loopback http URL
                    f"http://127.0.0.1:{self.port + 1}/json/", timeout=2) as reply:
                status = json.load(reply)
        except OSError:
            return 0
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def up(self, cores: int = 2, memory: str = "2g") -> str:
        """Start the master and a worker (``cores``, ``memory``) unless they run."""
        if not self._alive("master"):
            _check_port_free("spark master", self.port, "DBLOG_SPARK_CLUSTER_PORT")
            self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host",
                                   "127.0.0.1", "--port", str(self.port), "--webui-port",
                                   str(self.port + 1)])
        if not self._alive("worker"):
            self._spawn("worker", ["org.apache.spark.deploy.worker.Worker", self.master_url,
                                   "--host", "127.0.0.1", "--cores", str(cores), "--memory",
                                   memory, "--webui-port", str(self.port + 2)])
        _wait("spark cluster", lambda: self.workers() > 0, self.home / "logs" /
              "spark-worker.log")
        return f"spark cluster: {self.master_url} with a worker ({cores} cores, {memory})"

    def down(self) -> str:
        stopped = []
        for role in ("worker", "master"):
            pid = _pid_alive(self.dir / f"{role}.pid")
            if pid is not None:
                os.killpg(pid, signal.SIGTERM)
                stopped.append(role)
        return f"spark cluster: stopped {' and '.join(stopped) or 'nothing'}"


def up(home: Path | None = None, zk_nodes: int = 1) -> list[str]:
    """Start every local service that is not running; return one line per service.
    ``zk_nodes=3`` also starts the 3-node ZooKeeper ensemble (:func:`ensemble_hosts`)."""
    if zk_nodes not in (1, ENSEMBLE_NODES):
        raise ServiceError(f"--zk-nodes is 1 (standalone) or {ENSEMBLE_NODES} (an ensemble "
                           f"beside it), not {zk_nodes}")
    lines = [svc.up() for svc in _all(home)]
    if zk_nodes == ENSEMBLE_NODES:
        lines += ensemble_up(home)
    return lines


def down(home: Path | None = None) -> list[str]:
    """Stop the local services (the ensemble's nodes too, where they run)."""
    return [svc.down() for svc in [*_all(home), *ensemble(home)]]


def status(home: Path | None = None) -> list[str]:
    """One status line per local service."""
    return [svc.status() for svc in _all(home)]


def env_lines(home: Path | None = None) -> list[str]:
    """``export`` lines describing the local services, for a shell or a config."""
    ep = endpoints(home)
    return [
        f"export DBLOG_MARIADB_PORT={ep.mariadb_port}",
        f"export DBLOG_PG_PORT={ep.pg_port}",
        f"export DBLOG_ZK_PORT={ep.zk_port}",
        f"export DBLOG_ZK_ENSEMBLE={ensemble_hosts()}",
        f"export DBLOG_MARIADB_PASSWORD={ep.mariadb_password}",
        f"export DBLOG_PG_PASSWORD={ep.pg_password}",
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.services up|down|status|env``: the local services for
    development and tests (not part of the ``dblog`` command)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.services", description=(
        "local MariaDB, PostgreSQL and ZooKeeper on loopback, data under $DBLOG_HOME"))
    parser.add_argument("action", choices=["up", "down", "status", "env"])
    parser.add_argument("--zk-nodes", type=int, default=1, choices=[1, 3],
                        help="3: also run a 3-node ZooKeeper ensemble on loopback "
                             "($DBLOG_ZK_ENSEMBLE; the standalone node keeps running)")
    parser.add_argument("--spark-cluster", action="store_true",
                        help="also run a Spark standalone master and worker on loopback "
                             "(spark://127.0.0.1:17077; spark.master or $DBLOG_SPARK_MASTER)")
    args = parser.parse_args(argv)
    actions: dict[str, Callable[[], list[str]]] = {
        "up": lambda: up(zk_nodes=args.zk_nodes) + (
            [SparkStandalone().up()] if args.spark_cluster else []),
        "down": lambda: [*down(), SparkStandalone().down()],
        "status": status,
        "env": env_lines,
    }
    for line in actions[args.action]():
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
