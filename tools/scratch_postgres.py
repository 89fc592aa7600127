"""A throw-away PostgreSQL server for the tests and the bench: Debian's postgresql package, one private cluster.

`initdb` makes a cluster in a fresh temporary folder, `pg_ctl start -w` starts it (and waits until it accepts
connections), and the server listens on a unix socket in a private folder only (no TCP: `listen_addresses=''`,
so no port of the machine is taken and nothing else on the machine, a sandboxed kernel included, can reach it).
The socket's name still carries a port number, picked free on the loopback so that two servers never mix up.
PostgreSQL refuses to run as root: as root, the server runs as Debian's `postgres` user (the package makes it),
which owns the cluster's folders; otherwise it runs as the current user. `stop()` ends the server and removes
every file it made. Install the server with `make system-packages` (apt-get install postgresql).

    with ScratchPostgres() as pg:
        url = pg.create_database("gradebook")   # postgresql+psycopg2://postgres@/gradebook?host=...&port=...
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

SUPERUSER = "postgres"  # the cluster's superuser role (initdb -U), whatever the Unix user running it
INSTALL_HINT = "install Debian's postgresql (make system-packages, or: apt-get install postgresql)"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries, or the server did not start (the message says which, and what to do)."""


def server_bindir() -> Path:
    """The newest PostgreSQL server's bin folder (Debian keeps initdb and pg_ctl off PATH, in
    /usr/lib/postgresql/<major>/bin), else the one on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise PostgresUnavailable(f"no PostgreSQL server (initdb) on this machine: {INSTALL_HINT}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ScratchPostgres:
    """One private PostgreSQL cluster in a temporary folder, reachable on its unix socket only."""

    def __init__(self) -> None:
        self.bindir = server_bindir()
        self.port = free_port()
        self.top = Path(tempfile.mkdtemp(prefix="pg-"))  # short: a socket path holds at most 107 bytes
        self.data = self.top / "data"
        self.socket_dir = self.top / "socket"
        self.logfile = self.top / "server.log"
        self.user = None  # the Unix user the server runs as: None for the current one
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(f"running as root, and there is no 'postgres' user to run the server as: "
                                          f"{INSTALL_HINT}") from None
            self.user = account.pw_name
            os.chmod(self.top, 0o711)  # the server's user passes through, lists nothing
            for folder in (self.data, self.socket_dir):
                folder.mkdir(mode=0o700)
                os.chown(folder, account.pw_uid, account.pw_gid)
            self.logfile.touch(mode=0o600)
            os.chown(self.logfile, account.pw_uid, account.pw_gid)
        else:
            self.data.mkdir(mode=0o700)
            self.socket_dir.mkdir(mode=0o700)
        self.started = False

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), user=self.user, capture_output=True, text=True, cwd=self.top,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"})

    def start(self) -> ScratchPostgres:
        done = self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                         "-E", "UTF8", "--no-sync")
        if done.returncode:
            self.stop()
            raise PostgresUnavailable(f"initdb failed: {done.stderr.strip()[-500:]}")
        # fsync off: a scratch cluster for tests, thrown away afterwards (never for a real gradebook)
        options = f"-c listen_addresses='' -c unix_socket_directories={self.socket_dir} -p {self.port} -c fsync=off"
        done = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile), "-o", options,
                         "-w", "-t", "120", "start")
        if done.returncode:
            log = self.logfile.read_text(errors="replace")[-800:] if self.logfile.exists() else ""
            self.stop()
            raise PostgresUnavailable(f"the PostgreSQL server did not start: {done.stderr.strip()[-300:]} {log}")
        self.started = True
        return self

    def url(self, database: str = "postgres", driver: str = "psycopg2") -> str:
        """The SQLAlchemy URL of `database` on this server (over its unix socket)."""
        return f"postgresql+{driver}://{SUPERUSER}@/{database}?host={self.socket_dir}&port={self.port}"

    def create_database(self, name: str) -> str:
        """A new, empty database `name`; its SQLAlchemy URL."""
        done = self._run(str(self.bindir / "createdb"), "-h", str(self.socket_dir), "-p", str(self.port),
                         "-U", SUPERUSER, name)
        if done.returncode:
            raise PostgresUnavailable(f"createdb {name} failed: {done.stderr.strip()[-300:]}")
        return self.url(name)

    def stop(self) -> None:
        if self.started:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self.started = False
        shutil.rmtree(self.top, ignore_errors=True)

    def __enter__(self) -> ScratchPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
