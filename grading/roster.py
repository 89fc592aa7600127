"""Students added once: however a student enters the gradebook, they also enter the course's group on the hub.

nbgrader adds a student to the JupyterHub group nbgrader-<course> (its JupyterHubAuthPlugin) only when the
gradebook it writes to was given the authenticator: `nbgrader db student add` and `nbgrader db student import`
give it (nbgrader/apps/dbapp.py), the formgrader's Manage Students page does not (nbgrader 0.9.6: the handlers'
BaseHandler.gradebook in nbgrader/server_extensions/formgrader/base.py and NbGraderAPI.gradebook in
nbgrader/apps/api.py open `Gradebook(db_url, course_id)`): that student lands in the gradebook, is not in the
group, and sees no course. install() makes both gradebooks carry the authenticator, so the formgrader adds to
both. With nbgrader's default NoAuthPlugin (one machine, no hub) adding
to a course does nothing, as before.
"""

from __future__ import annotations


def install() -> None:
    """Make every NbGraderAPI (the formgrader's, checked subclasses included) open its gradebook with the
    authenticator (once per process)."""
    from nbgrader.api import Gradebook
    from nbgrader.apps.api import NbGraderAPI

    def gradebook(self) -> Gradebook:
        return Gradebook(self.coursedir.db_url, self.course_id, self.authenticator)

    gradebook.minialloc_roster = True
    if not getattr(NbGraderAPI.gradebook.fget, "minialloc_roster", False):
        NbGraderAPI.gradebook = property(gradebook, doc=NbGraderAPI.gradebook.__doc__)

    from nbgrader.server_extensions.formgrader.base import BaseHandler

    def handler_gradebook(self) -> Gradebook:
        # the handlers keep one gradebook in the application's settings, as nbgrader's own property does
        if self.settings["nbgrader_gradebook"] is None:
            # the extension's own authenticator is None (nbgrader 0.9.6); the API's is made from the configuration
            authenticator = self.authenticator or self.api.authenticator
            self.settings["nbgrader_gradebook"] = Gradebook(self.db_url, self.coursedir.course_id, authenticator)
        return self.settings["nbgrader_gradebook"]

    handler_gradebook.minialloc_roster = True
    if not getattr(BaseHandler.gradebook.fget, "minialloc_roster", False):
        BaseHandler.gradebook = property(handler_gradebook)
