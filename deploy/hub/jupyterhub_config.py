"""JupyterHub for one class on one machine: PAM logins, one server per student, nbgrader's grading service.

Run as root, from a private folder the hub keeps its database and cookie secret in, with the class's venv (`make
hub`: JupyterHub, nbgrader, minialloc) first on PATH and the proxy (deploy/hub/node_modules/.bin) on it too:

    mkdir -p -m 700 /srv/jupyterhub && cd /srv/jupyterhub
    PATH=/opt/minialloc-course/.venv-hub/bin:/opt/minialloc-course/deploy/hub/node_modules/.bin:$PATH \
        jupyterhub -f /opt/minialloc-course/deploy/hub/jupyterhub_config.py --port 8000

The class is described by class.json beside this file (or the file MINIALLOC_HUB_CLASS names): the course id
(the repository's nbgrader_config.py has the same one), the grader account that runs the grading service and
owns the course directory, the instructors, the Unix group whose members may log in, and the exchange.
tests/test_jupyterhub.py runs this file as it is, with its own class.json; docs/jupyterhub.md explains each part.

Roles (JupyterHub 2 and later give a service and a group nothing they are not granted):
- the grading service reads users and groups and adds students to the course's group (nbgrader's
  JupyterHubAuthPlugin: GET /users/<name>, GET /groups, POST /groups/nbgrader-<course>/users);
- the instructors (group formgrade-<course>) may open the grading service;
- a student's server may read its own user's groups (the Assignments tab lists the courses from them).
"""

import grp
import json
import os
import pwd
import socket
import sys
from pathlib import Path

c = get_config()  # noqa: F821 -- traitlets defines get_config() when it loads this file

HERE = Path(__file__).resolve().parent
CLASS = json.loads(Path(os.environ.get("MINIALLOC_HUB_CLASS", HERE / "class.json")).read_text(encoding="utf-8"))
COURSE = CLASS["course_id"]
BIN = Path(sys.executable).parent  # the class's venv, which runs this hub: jupyterhub-singleuser, nbgrader


def free_loopback_port() -> int:
    """A port nothing listens on now: the hub's internal ports must not collide with another service's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# === Network: the proxy's public port on loopback (put a TLS front, or set ip, for students elsewhere); the hub's
# API, the proxy's API, every server and every kernel on 127.0.0.1 ===============================================
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = 8000
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = free_loopback_port()
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{free_loopback_port()}"
c.ConfigurableHTTPProxy.command = ["configurable-http-proxy"]  # from PATH: deploy/hub/node_modules/.bin

# === Logins: PAM (the machine's passwords), members of the class's Unix group only ===============================
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {CLASS["login_group"]}
# the group's members are the hub's users from its start: nbgrader can add a student to the course's group (the
# formgrader, `nbgrader db student add`) only once the hub knows them, and they need not have logged in yet (a
# member added to the Unix group later is known after their first login or the hub's next start)
c.Authenticator.allowed_users = set(grp.getgrnam(CLASS["login_group"]).gr_mem)
c.Authenticator.admin_users = set()
# accounts the hub creates (an admin adding a user on the admin page, with create_system_users) get a private home
c.LocalAuthenticator.add_user_cmd = ["useradd", "-m", "-K", "HOME_MODE=0700"]

# === Students' servers: LocalProcessSpawner, each as its own Unix user, in its own home ==========================
# No memory or CPU limit: LocalProcessSpawner sets none (docs/jupyterhub.md, "Sizing", says what does).
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.ip = "127.0.0.1"
c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
c.Spawner.args = ["--KernelManager.ip=127.0.0.1"]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.http_timeout = 120  # a first JupyterLab start on a busy machine (measured 9 to 14 s idle)
c.Spawner.start_timeout = 120
# student/ switches off the formgrader, Create Assignment and the course list; site/ holds the class's nbgrader
# settings (exchange, JupyterHubAuthPlugin)
c.Spawner.environment = {"JUPYTER_CONFIG_PATH": f"{HERE / 'student'}:{HERE / 'site'}",
                         "MINIALLOC_EXCHANGE": CLASS["exchange"],
                         "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin"}


def private_home(spawner) -> None:
    """A home others can enter lets every student read every other's work (useradd -m makes 0755 homes)."""
    home = pwd.getpwnam(spawner.user.name).pw_dir
    os.chmod(home, os.stat(home).st_mode & 0o700)


c.Spawner.pre_spawn_hook = private_home


def make_exchange(path: str) -> None:
    """The exchange, as nbgrader wants it: anyone may write, nobody removes another's entry (sticky)."""
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o1777)


make_exchange(CLASS["exchange"])

# === The grading service: nbgrader's formgrader, as the grader account, on the course directory ==================
GRADER_PORT = free_loopback_port()
c.JupyterHub.services = [{
    "name": COURSE,
    "url": f"http://127.0.0.1:{GRADER_PORT}",
    "command": [str(BIN / "jupyterhub-singleuser"), f"--port={GRADER_PORT}", "--KernelManager.ip=127.0.0.1",
                "--ServerApp.jpserver_extensions=grading.browser_guard=True"],  # `make grade`'s browser defences
    "user": CLASS["grader"],
    "cwd": CLASS["course_dir"],  # the repository's clone: nbgrader reads its nbgrader_config.py from here
    "environment": {"JUPYTER_CONFIG_PATH": str(HERE / "site"), "MINIALLOC_EXCHANGE": CLASS["exchange"],
                    "JUPYTERHUB_DEFAULT_URL": "/formgrader",
                    # nbgrader's JupyterHubAuthPlugin needs a user name even in a service (it fails without)
                    "JUPYTERHUB_USER": CLASS["grader"],
                    "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin"},
    "oauth_no_confirm": True,
}]

c.JupyterHub.load_groups = {
    # the instructors open the grading service; nbgrader's auth plugin counts formgrade-<course> as the course too,
    # and asks the hub for the grader account's courses (so the grader is a hub user, in this group, as nbgrader's
    # docs have it; it has no password and no login of its own)
    f"formgrade-{COURSE}": {"users": [*CLASS["instructors"], CLASS["grader"]]},
    # the students: nbgrader adds them (nbgrader db student add / import, the formgrader's Manage Students)
    f"nbgrader-{COURSE}": {"users": []},
}
c.JupyterHub.load_roles = [
    {"name": f"grading-{COURSE}", "services": [COURSE],
     "scopes": ["list:users", "read:users", "read:users:groups", "list:groups", "read:groups", "groups"]},
    {"name": f"formgrade-{COURSE}", "groups": [f"formgrade-{COURSE}"],
     "scopes": [f"access:services!service={COURSE}"]},
    # a server's own token: JupyterHub's default scopes, plus its user's name and groups (the Assignments tab)
    {"name": "server", "scopes": ["users:activity!user", "access:servers!server", "read:users:name!user",
                                  "read:users:groups!user"]},
]
