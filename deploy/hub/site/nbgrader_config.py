"""The class's nbgrader settings for every account on the hub: students' servers and the grading service.

The hub puts this folder on JUPYTER_CONFIG_PATH and MINIALLOC_EXCHANGE in the environment of every server it
starts (deploy/hub/jupyterhub_config.py), so it is the site's configuration: the repository's nbgrader_config.py
sets no exchange, and nothing overrides this one. Elsewhere, copy it to /etc/jupyter/nbgrader_config.py.
"""

import os

from nbgrader.auth import JupyterHubAuthPlugin

c = get_config()  # noqa: F821 -- traitlets defines get_config() when it loads this file

# one exchange for the class, outside every home and the course directory (made by the hub: jupyterhub_config.py)
c.Exchange.root = os.environ.get("MINIALLOC_EXCHANGE", "/srv/nbgrader/exchange")
# students fetch into ~/<course id>/<assignment>/ (the course id is no Python name: nothing it makes shadows a
# package)
c.Exchange.path_includes_course = True
# who takes a course is the hub's group nbgrader-<course id>: a student sees, fetches and submits only those courses
c.Authenticator.plugin_class = JupyterHubAuthPlugin

# a student added on the formgrader's Manage Students page joins nbgrader-<course id> too, as with
# `nbgrader db student add` (grading/roster.py)
from grading import roster  # noqa: E402

roster.install()
