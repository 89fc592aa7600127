"""The learner's JupyterLab (course/jupyter-learner/, which `make course` adds to JUPYTER_CONFIG_PATH): no
nbgrader Validate button, instructor menus or news toast, and widget state saved with the notebook so a reopened
chapter shows its widgets."""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LEARNER = ROOT / "course" / "jupyter-learner"
VALIDATE = "@jupyter/nbgrader:validate-assignment"
WIDGETS = "@jupyter-widgets/jupyterlab-manager:plugin"


LABEXTENSIONS = Path(sys.prefix) / "share" / "jupyter" / "labextensions"


def _labextension_text(package: str) -> str:
    static = LABEXTENSIONS / package
    if not static.is_dir():
        pytest.skip(f"{package} is not installed in this environment")
    return "".join(p.read_text(encoding="utf-8", errors="replace") for p in static.rglob("*.js"))


# the instructor's nbgrader tools and JupyterLab's news toast: off for the learner; the learner's own
# Assignments list (@jupyter/nbgrader:assignment-list) stays
NBGRADER_INSTRUCTOR = ("@jupyter/nbgrader:menu", "@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:course-list",
                       "@jupyter/nbgrader:create-assignment")
NEWS = "@jupyterlab/apputils-extension:announcements"
DISABLED = {VALIDATE: True, NEWS: True, **dict.fromkeys(NBGRADER_INSTRUCTOR, True)}


def test_the_learner_lab_disables_validate_the_instructor_tools_and_the_news(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyterlab_server.config import get_static_page_config

    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(LEARNER))
    assert get_static_page_config(level="all")["disabledExtensions"] == DISABLED
    monkeypatch.delenv("JUPYTER_CONFIG_PATH")
    instructor = get_static_page_config(level="all").get("disabledExtensions", {})
    assert not set(DISABLED) & set(instructor)  # the instructor's JupyterLab keeps them all


def test_the_disabled_plugins_are_ones_the_extensions_define() -> None:
    # a renamed plugin would leave the button or menu in place silently: each id must be one an extension defines
    nbgrader = _labextension_text("@jupyter/nbgrader")
    for plugin in (VALIDATE, *NBGRADER_INSTRUCTOR):
        assert f'"{plugin}"' in nbgrader, plugin
    lab = Path(sys.prefix) / "share" / "jupyter" / "lab" / "static"
    if not lab.is_dir():
        pytest.skip("JupyterLab's static files are not installed here")
    assert any(f'"{NEWS}"' in p.read_text(encoding="utf-8", errors="replace") for p in lab.glob("*.js"))


def test_the_learner_lab_saves_widget_state(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyterlab_server.settings_utils import _get_overrides

    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(LEARNER))
    overrides, error = _get_overrides(str(LEARNER / "no-app-settings"))
    assert not error and overrides[WIDGETS] == {"saveState": True}
    # the setting must exist in the installed widget manager, or the override does nothing
    manager = "@jupyter-widgets/jupyterlab-manager"
    schema = LABEXTENSIONS / manager / "schemas" / manager / "plugin.json"
    if not schema.exists():
        pytest.skip("the widget manager's lab extension is not installed")
    assert "saveState" in json.loads(schema.read_text(encoding="utf-8"))["properties"]


def test_the_stepper_says_to_rerun_its_cell_after_a_reopen() -> None:
    # saved widget state shows the stepper's last view, but its controls need a kernel: the view says so
    pytest.importorskip("ipywidgets")
    from minialloc import viz
    from minialloc.lang import using
    from minialloc.viz.stepper import TEXT
    from minialloc.workloads import canonical_scenario

    stepper = viz.Stepper(canonical_scenario()[:4], "", capacity="8GiB")
    for lang in ("en", "vi", "de"):
        with using(lang):
            assert html.escape(TEXT["rerun"][lang]) in stepper.widget().children[1].value
