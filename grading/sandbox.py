"""A bubblewrap sandbox for the student kernels that nbgrader's autograde starts.

Autograde runs each student's notebook in a fresh kernel; that kernel runs the student's code, so it gets only
what grading needs:

- files: the system's /usr (and /lib, /bin... or their merged-/usr links), the dynamic loader's and fontconfig's
  files from /etc, the Python installation and the virtual environment read-only, the packages the notebooks
  import (`minialloc`) read-only, and a private copy of the submission's own folder read-write. Nothing else
  exists in its file system: not labs/source/, not the private bank, not the gradebook, not the issuer key, not
  any home directory (`sandbox_can_read` answers for one path);
- no network: a network namespace of its own with only a loopback interface. The grader talks to the kernel over
  ZeroMQ's ipc transport (unix sockets in a folder bound into the sandbox), which needs no network at all;
- no life of its own: a pid namespace whose first process is bubblewrap's; when the kernel exits or the grader
  kills it, every process the student started dies with it (--die-with-parent, --unshare-pid);
- limits: when the grader runs as root, the kernel runs as an unused user id of its own, so that RLIMIT_NPROC caps
  its processes and threads (the kernel does not apply it to root); RLIMIT_AS caps its address space, RLIMIT_FSIZE
  the size of any file it writes;
- no view of its own policy: bubblewrap reads its options (every bound host path, the environment it sets) from
  a memfd (`bwrap --args FD`) that it closes before the kernel starts, so /proc/1/cmdline, the first process of
  the sandbox's pid namespace, shows `bwrap --args FD -- python ... ipykernel_launcher -f <connection file>`
  and no path of the policy; bubblewrap itself gets an environment of only PATH (and jupyter_client's
  JPY_PARENT_PID), not the grader's, so no process of the sandbox holds the grader's environment either;
- a cap on each message the grader accepts from the kernel (ZMQ_MAXMSGSIZE on the grader's sockets): a 200 MB
  print is refused by ZeroMQ before the grader allocates it, so the grader never holds it.

The kernel manager below is what nbgrader's Execute starts (grading.preprocessors.GuardedExecute installs
it); it ignores the notebook's kernelspec, so a submission cannot pick an unsandboxed kernel.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from traitlets import Int, List, Unicode, default

from .privacy import scratch_root

GiB = 1024**3
MiB = 1024**2

# System trees bound read-only (or recreated as the same symbolic links on merged-/usr systems).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The few files of /etc that Python, numpy and matplotlib read; /etc as a whole holds secrets (shadow, ssh keys).
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/fonts",
             "/etc/alternatives", "/etc/mime.types")
# Environment variables the kernel inherits from the grader; everything else is cleared (a course secret in the
# grader's environment must not reach student code).
PASS_ENV = ("LANG", "LC_ALL", "TZ", "PYTHONPATH", "MPLBACKEND", "MINIALLOC_DEVICE", "MINIALLOC_ALLOC_CONF",
            "NBGRADER_EXECUTION")

# Run inside the sandbox, as root, by `python -I -S -c`: set the limits, drop to the sandbox's own user id, then
# become the kernel. Written out here because nothing of the repository needs to be readable for it to run.
LAUNCHER = """\
import os, resource, sys
uid, nproc, memory, fsize = (int(a) for a in sys.argv[1:5])
# RLIMIT_NPROC counts every process of the user id: only for the sandbox's own id (a grader running as root)
limits = [(resource.RLIMIT_AS, memory), (resource.RLIMIT_FSIZE, fsize)] + [(resource.RLIMIT_NPROC, nproc)] * (uid >= 0)
for which, value in limits:
    if value > 0:
        resource.setrlimit(which, (value, value))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise SystemExit("sandbox: the kernel could become root again")
os.execv(sys.argv[5], sys.argv[5:])
"""


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


# Run by the kernel's interpreter, with the kernel's PYTHONPATH, in an empty folder: where each named package is
# imported from, as JSON. A dotted name's parents are searched, not imported (importing `quizzes` would run its
# __init__ outside the sandbox for nothing); `find_spec` runs no package code.
RESOLVER = """\
import importlib.machinery, importlib.util, json, sys
found = {}
for name in sys.argv[1:]:
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    for part in rest:
        places = spec and spec.submodule_search_locations
        spec = places and importlib.machinery.PathFinder.find_spec(f"{spec.name}.{part}", list(places))
    found[name] = spec and (list(spec.submodule_search_locations or ()) or [spec.origin])
print(json.dumps(found))
"""


def package_dirs(names: Iterable[str], env: Mapping[str, str] | None = None) -> list[Path]:
    """Where the student kernel imports the named packages from: asked of the kernel's interpreter with the
    kernel's PYTHONPATH (`env`, the variables it inherits; the grader's by default), not of the grader's process.

    The grader may run from a folder holding a copy of the project (its current folder is on its sys.path) while
    the environment's editable install points at another checkout: the kernel imports the install's, so that is
    the one to bind. The resolver runs in an empty folder: the kernel's own folder is the submission's copy, bound
    read-write already, and student files must not be importable outside the sandbox. The kernel's home is the
    sandbox's empty /tmp, so no user site-packages (PYTHONNOUSERSITE). A package the kernel cannot import at all
    stops autograde with one line saying where the grader finds it instead.
    """
    names = list(names)
    inherited = os.environ if env is None else env
    kernel = {**{v: inherited[v] for v in PASS_ENV if v in inherited}, "PYTHONNOUSERSITE": "1"}
    with tempfile.TemporaryDirectory(prefix="minialloc-resolve-") as empty:
        done = subprocess.run([sys.executable, "-c", RESOLVER, *names], cwd=empty, env=kernel,
                              capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"the sandbox could not ask {sys.executable} where it imports {names} from: {last}")
    found: dict[str, list[str] | None] = json.loads(done.stdout)
    out = []
    for name in names:
        if not found[name]:
            raise ModuleNotFoundError(
                f"the student kernel ({sys.executable}, PYTHONPATH={kernel.get('PYTHONPATH', '')!r}) cannot import "
                f"{name!r}, {_grader_sees(name)}: install the project in this "
                f"environment (pip install -e .) or put its folder on PYTHONPATH")
        out += [Path(p) for p in found[name]]
    return out


def _grader_sees(name: str) -> str:
    """Where the grader's own process finds `name`, for the error message (the difference between the two)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "which the grader cannot import either"
    return "which the grader imports from " + ", ".join(spec.submodule_search_locations or [str(spec.origin)])


# What a package folder may show the kernel when it is marked code-only (a course directory inside it: the graded
# quiz's course root is quizzes/graded/): Python modules and nothing an nbgrader course puts there.
CODE_SUFFIXES = (".py", ".pyi", ".typed")


def not_code(folder: Path) -> list[Path]:
    """The entries of `folder` that are not Python modules (checked when the kernel starts): nbgrader's source,
    release, submitted, autograded and feedback folders, gradebook.db, an exchange, a log, exported grades."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return [Path(e.path) for e in entries
            if e.is_symlink() or not (e.is_file(follow_symlinks=False) and e.name.endswith(CODE_SUFFIXES))]


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _real(path: Path | str) -> Path:
    return Path(os.path.realpath(path))


@dataclass(frozen=True)
class Policy:
    """What the sandbox binds, and its limits. `Policy.default()` is what autograde uses unless configured."""

    read_only: tuple[Path, ...]
    hidden: tuple[Path, ...] = ()  # empty folders mounted over these (parts of a read-only tree)
    memory_bytes: int = 3 * GiB  # RLIMIT_AS; the kernel with numpy and matplotlib loaded takes about 0.3 GiB
    max_processes: int = 128  # RLIMIT_NPROC of the sandbox's user: processes and threads together
    file_size_bytes: int = 256 * MiB  # RLIMIT_FSIZE: the largest file the kernel may write

    @classmethod
    def default(cls, packages: Sequence[str] = ("minialloc",), extra_read_only: Sequence[str | Path] = (),
                hidden: Sequence[str | Path] = (), code_only: Sequence[str | Path] = (),
                env: Mapping[str, str] | None = None, **limits: int) -> Policy:
        """`env`: the environment the kernel inherits from (the grader's by default); its PYTHONPATH decides which
        copy of each package the kernel imports, and so which is bound (`package_dirs`)."""
        trees = [Path(sys.base_prefix), Path(sys.base_exec_prefix), Path(sys.prefix), Path(sys.exec_prefix),
                 _real(sys.executable).parent.parent, *package_dirs(packages, env), *map(Path, extra_read_only)]
        trees = [_real(p) for p in trees]
        trees = [p for p in dict.fromkeys(trees) if p.exists()]
        # a tree inside another bound tree is bound already
        trees = [p for p in trees if not any(q != p and _inside(p, q) for q in trees)]
        masked = [Path(os.path.abspath(h)) for h in hidden]
        for folder in map(Path, code_only):
            masked += not_code(folder)
        # a link is masked where it is (following it would mask, or fail on, what it points to)
        masked = [m if os.path.islink(m) else _real(m) for m in masked]
        return cls(tuple(trees), tuple(dict.fromkeys(masked)), **limits)

    def can_read(self, path: str | Path, writable: Sequence[str | Path] = ()) -> bool:
        """Could code in this sandbox read `path`? `writable` are the folders bound read-write (the submission)."""
        real = _real(path)
        if any(_inside(real, h) for h in self.hidden):
            return False
        if real.parts[:2] == ("/", "etc"):
            roots = [Path(p) for p in ETC_FILES if _inside(real, _real(p))]
        else:
            roots = [_real(p) for p in [*SYSTEM_DIRS, *self.read_only] if _inside(real, _real(p))]
        own = [_real(p) for p in writable if _inside(real, _real(p))]
        if own:
            return True  # the sandbox's own copy of the submission: its user owns every file
        if not roots or not real.exists():
            return False
        root = max(roots, key=lambda p: len(p.parts))
        if os.geteuid() != 0:  # the kernel runs as the grader's user: the grader's own rights apply
            return os.access(real, os.R_OK)
        # the kernel runs as an unused user id with no groups: only the "other" permission bits apply, on the
        # file and on every folder from the bound tree down to it (the folders above are the sandbox's own)
        node = real
        while node != root:
            node = node.parent
            if not os.stat(node).st_mode & stat.S_IXOTH:
                return False
        return bool(os.stat(real).st_mode & stat.S_IROTH)

    def command(self, argv: Sequence[str], *, workdir: Path, rw: Mapping[Path, Path] | Sequence[Path] = (),
                env: Mapping[str, str] | None = None, uid: int = -1) -> list[str]:
        """The bwrap command line that runs `argv` (the kernel) in this sandbox, in `workdir` (a path inside it).

        `rw` are folders bound read-write: a list binds each at its own path, a mapping binds source -> place
        (the submission's copy where the submission was); `uid` >= 0 makes the launcher drop to that user id after
        setting the limits.
        """
        bwrap = bwrap_path()
        if bwrap is None:
            raise RuntimeError("bubblewrap is not installed (apt-get install bubblewrap): autograde will not run "
                               "student kernels unsandboxed unless GuardedExecute.sandbox is set to False")
        cmd = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
               "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]
        mounted: list[Path] = []
        made: set[Path] = set()

        def parents(dest: Path) -> None:
            # bwrap creates missing parents as 0700 folders, which the unprivileged kernel could not cross
            for parent in reversed(dest.parents):
                if parent == Path("/") or parent in made or any(_inside(parent, m) for m in mounted):
                    continue
                cmd.extend(["--perms", "0755", "--dir", str(parent)])
                made.add(parent)

        for top in SYSTEM_DIRS:
            if os.path.islink(top):
                cmd.extend(["--symlink", os.readlink(top), top])
            elif os.path.isdir(top):
                cmd.extend(["--ro-bind", top, top])
                mounted.append(Path(top))
        for name in ETC_FILES:
            cmd.extend(["--ro-bind-try", name, name])
        # the sandbox's own /proc, /dev and /tmp first: a tree bound later below /tmp stays visible
        cmd.extend(["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"])
        made.update({Path("/proc"), Path("/dev"), Path("/tmp")})  # not to be recreated as 0755 folders
        for tree in sorted(self.read_only, key=lambda p: len(p.parts)):
            if any(_inside(tree, m) for m in mounted):
                continue
            parents(tree)
            cmd.extend(["--ro-bind", str(tree), str(tree)])
            mounted.append(tree)
        for hidden in self.hidden:
            if os.path.islink(hidden):
                continue  # a link inside a bound tree shows what it points to, which is not bound here
            if hidden.is_dir():
                cmd.extend(["--perms", "0755", "--tmpfs", str(hidden)])
            elif hidden.exists():  # a file (a gradebook, a log): shown empty
                cmd.extend(["--ro-bind", "/dev/null", str(hidden)])
        binds = dict(rw) if isinstance(rw, Mapping) else {p: p for p in rw}
        for source, place in sorted(((_real(s), Path(os.path.abspath(d))) for s, d in binds.items()),
                                    key=lambda sd: len(sd[1].parts)):
            parents(place)
            cmd.extend(["--bind", str(source), str(place)])
        # /tmp is the sandbox's own, empty and writable by all: the kernel's home and caches live there
        variables = {"HOME": "/tmp", "USER": "student",
                     "PATH": f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin",
                     "IPYTHONDIR": "/tmp/.ipython", "MPLCONFIGDIR": "/tmp/.matplotlib",
                     "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                     "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2", **(env or {})}
        for name, value in variables.items():
            cmd.extend(["--setenv", name, value])
        cmd.extend(["--chdir", str(workdir), "--", sys.executable, "-I", "-S", "-c", LAUNCHER, str(uid),
                    str(self.max_processes), str(self.memory_bytes), str(self.file_size_bytes), *argv])
        return cmd


def with_args_fd(cmd: Sequence[str]) -> tuple[list[str], int]:
    """`cmd` (bubblewrap's whole command line) as `bwrap --args FD -- COMMAND...`, and FD: a memfd holding the
    options, NUL-separated (bwrap(1), --args). The caller passes FD to bubblewrap (Popen's pass_fds) and closes
    its own copy after the launch; bubblewrap reads it to the end and closes it before running COMMAND."""
    split = list(cmd).index("--")
    fd = os.memfd_create("bwrap-args", os.MFD_CLOEXEC)  # pass_fds makes the child's copy inheritable
    view = memoryview(b"".join(arg.encode() + b"\0" for arg in cmd[1:split]))
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return [cmd[0], "--args", str(fd), *cmd[split:]], fd


def sandbox_can_read(path: Path, policy: Policy | None = None) -> bool:
    """Would a student kernel that autograde starts be able to read `path`?

    Unless `policy` is given, asks the widest of the repository's two configurations: the labs' kernel binds
    `minialloc`, the graded quiz's binds `quizzes` too. The submission's own folder is readable as well; it is a
    copy made per kernel, so nothing else lives there.
    """
    if policy is None:
        graded = package_dirs(["quizzes.graded"])
        policy = Policy.default(packages=("minialloc", "quizzes"), code_only=graded)
    return policy.can_read(path)


_uids = itertools.count()


def capped_context(max_message_bytes: int) -> zmq.asyncio.Context:
    """A ZeroMQ context whose sockets drop a peer that sends a message over `max_message_bytes`, before allocating
    it (ZMQ_MAXMSGSIZE, a default for every socket made from the context)."""
    context = zmq.asyncio.Context()
    context.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    return context


class SandboxKernelManager(AsyncKernelManager):
    """An ipykernel started inside the sandbox, reached over ZeroMQ's ipc transport.

    The kernelspec is fixed here (this Python's ipykernel, interrupted by a control message: the kernel runs in a
    session of its own, --new-session, which a SIGINT to bubblewrap's process group does not reach); the
    notebook's own kernelspec is ignored.
    """

    packages = List(Unicode(), ["minialloc"], help="Packages the kernel imports, bound read-only.").tag(config=True)
    extra_read_only = List(Unicode(), [], help="More paths bound read-only at their own place.").tag(config=True)
    hidden = List(Unicode(), [], help="Folders and files inside the bound trees that the kernel sees empty.").tag(
        config=True)
    code_only = List(Unicode(), [], help=(
        "Folders inside the bound trees of which the kernel sees only the Python files (*.py) at the top level: "
        "every other entry, folders included, is seen empty (an nbgrader course directory inside a package)."
    )).tag(config=True)
    memory_bytes = Int(3 * GiB, help="RLIMIT_AS of the kernel (0: none).").tag(config=True)
    max_processes = Int(128, help="RLIMIT_NPROC of the kernel's own user id, threads included (0: none).").tag(
        config=True)
    file_size_bytes = Int(256 * MiB, help="RLIMIT_FSIZE of the kernel (0: none).").tag(config=True)
    max_message_bytes = Int(16 * MiB, help="Largest message the grader accepts from the kernel.").tag(config=True)
    uid_base = Int(200_000, help="The kernels' user ids are uid_base + 0..49999 (when the grader is root).").tag(
        config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.transport = "ipc"
        self.cache_ports = False
        self._scratch: Path | None = None  # the kernel's connection folder and its copy of the submission
        self._workdir_source = Path.cwd()
        self._uid = -1  # the kernel's own user id when the grader is root
        self._args_fd: int | None = None  # bubblewrap's options, until it is launched
        self._spec = KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                                display_name="Python 3 (grader sandbox)", language="python",
                                interrupt_mode="message", env={}, metadata={})

    @property
    def kernel_spec(self) -> KernelSpec:
        return self._spec

    @property
    def ipykernel(self) -> bool:
        return True

    def policy(self, env: Mapping[str, str] | None = None) -> Policy:
        return Policy.default(self.packages, self.extra_read_only, self.hidden, self.code_only, env=env,
                              memory_bytes=self.memory_bytes, max_processes=self.max_processes,
                              file_size_bytes=self.file_size_bytes)

    def client(self, **kwargs):
        # the client's own context (the manager destroys its context at shutdown, before nbclient stops the
        # client's channels), capped like the manager's
        kwargs.setdefault("context", capped_context(self.max_message_bytes))
        client = super().client(**kwargs)
        client._created_context = True  # so the client destroys it when its channels stop
        return client

    @default("context")
    def _context_default(self) -> zmq.asyncio.Context:
        self._created_context = True
        return capped_context(self.max_message_bytes)

    async def _async_pre_start_kernel(self, **kw):
        # inside a folder only the grader can enter (grading/privacy.py): the copy holds the student's answers
        self._scratch = Path(tempfile.mkdtemp(prefix="minialloc-sandbox-", dir=scratch_root()))
        os.chmod(self._scratch, 0o711)
        conn = self._scratch / "conn"
        conn.mkdir(mode=0o700)
        work = self._scratch / "work"
        source = Path(kw.get("cwd") or os.getcwd())
        # the kernel works in a copy of the submission's folder (symbolic links copied as links: a link to a key
        # must not be followed by the grader); what it writes there never reaches the grader's files
        shutil.copytree(source, work, symlinks=True)
        self._workdir_source = source
        if os.geteuid() == 0:
            self._uid = self.uid_base + (os.getpid() * 131 + next(_uids)) % 50_000
            for folder, _, files in os.walk(self._scratch):
                for name in [folder, *(os.path.join(folder, f) for f in files)]:
                    os.lchown(name, self._uid, self._uid)
        self.ip = str(conn / "kernel")
        self.connection_file = str(conn / "kernel.json")
        # the kernel inherits no descriptor of the grader's: its stdin, stdout and stderr are /dev/null (not the
        # grader's log or terminal), and Popen closes every other descriptor (close_fds, its default)
        kw.update(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
        try:
            cmd, kw = await super()._async_pre_start_kernel(**kw)
            cmd, self._args_fd = with_args_fd(cmd)
        except BaseException:  # no kernel will use the copy (bwrap missing, a bad setting): do not leave it behind
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
            raise
        # bubblewrap's own environment is the sandbox's first process's: nothing of the grader's (--clearenv
        # clears only the kernel's; the variables the kernel gets are in the options)
        kw.update(pass_fds=(self._args_fd,), env={"PATH": os.defpath})
        return cmd, kw

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        try:
            await super()._async_launch_kernel(kernel_cmd, **kw)
        finally:
            if self._args_fd is not None:
                os.close(self._args_fd)
                self._args_fd = None

    def write_connection_file(self, **kwargs) -> None:
        super().write_connection_file(**kwargs)
        if self._uid >= 0:
            os.chown(self.connection_file, self._uid, self._uid)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        inner = super().format_kernel_cmd(extra_arguments)
        launch_env = {**os.environ, **((self._launch_args or {}).get("env") or {})}
        env = {name: launch_env[name] for name in PASS_ENV if name in launch_env}
        conn = self._scratch / "conn"
        # the copy is bound where the submission was, so the paths the notebook sees are the submission's own
        place = Path(os.path.abspath(self._workdir_source))
        return self.policy(env).command(inner, workdir=place, rw={conn: conn, self._scratch / "work": place},
                                        env=env, uid=self._uid)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart)
        if self._scratch is not None and not restart:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    cleanup_resources = _async_cleanup_resources
