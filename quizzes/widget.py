"""The practice quiz as ipywidgets 8 (JupyterLab 4): one question at a time, instant feedback, three languages.

Only standard widgets, so the keyboard works as everywhere in Jupyter: Tab moves between controls, arrow keys
choose a radio option, Space ticks a box or presses a button, Enter presses a focused button or submits the
number field. After a check the focus moves to "Next question", after "Next" back to the answer. Feedback sits
in an aria-live region, so a screen reader reads it out.

Where no widget can be drawn (nbconvert, a CI log), the output's text/plain is the whole quiz as text.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w

from .i18n import LANG_NAMES, LANGS, pick, to_html, to_plain, ui
from .practice import Feedback, PracticeSession, render_text

_FULL = w.Layout(width="100%")
# Long answers must wrap: ipywidgets gives radio and checkbox labels one fixed line, so a long option would run
# over the next one. Scoped to the quiz's own class.
_STYLE = """<style>
.minialloc-quiz .widget-radio-box label, .minialloc-quiz .widget-checkbox label {
  display: flex; align-items: flex-start; gap: 0.45em; white-space: normal; height: auto; line-height: 1.35;
  overflow: visible; text-overflow: clip; margin-bottom: 0.35em; }
.minialloc-quiz .widget-radio-box label input, .minialloc-quiz .widget-checkbox input {
  flex: none; order: -1; margin-top: 0.2em; }
.minialloc-quiz .widget-checkbox { height: auto; min-height: var(--jp-widgets-inline-height, 28px); }
</style>"""


class PracticeQuiz(w.VBox):
    """The widget practice() returns in a notebook."""

    def __init__(self, session: PracticeSession) -> None:
        self.session = session
        self._title = w.HTML()
        self._lang = w.ToggleButtons(
            options=[(LANG_NAMES[lang], lang) for lang in LANGS], value=session.lang,
            style={"button_width": "auto"}, tooltips=[LANG_NAMES[lang] for lang in LANGS],
        )
        self._bar = w.IntProgress(min=0, max=session.total, value=0, layout=w.Layout(width="12em"))
        self._progress = w.Label()
        self._question = w.HTML(layout=_FULL)
        self._exhibit = w.HTML(layout=_FULL)
        self._choice = w.RadioButtons(options=[], value=None, layout=_FULL)
        self._boxes: list[w.Checkbox] = []
        self._many = w.VBox(layout=_FULL)
        self._number = w.Text(layout=w.Layout(width="16em"))
        self._number.on_msg(self._on_text_msg)  # Enter in the field: ipywidgets 8's "submit" message
        self._hint = w.HTML()
        self._answer = w.VBox(layout=_FULL)
        fit = w.Layout(width="auto", min_width="8em")  # the label decides the width, in every language
        self._check = w.Button(button_style="primary", icon="check", layout=fit)
        self._next = w.Button(icon="arrow-right", layout=fit)
        self._retry = w.Button(icon="refresh", layout=fit)
        self._feedback = w.HTML(layout=_FULL)
        # saved widget state (the learner's JupyterLab saves it) redraws the quiz in a reopened notebook, where no
        # kernel answers the buttons: this line says what to do then
        self._rerun = w.HTML(layout=_FULL)

        self._lang.observe(self._on_lang, "value")
        self._check.on_click(lambda _: self.submit())
        self._next.on_click(lambda _: self.go_next())
        self._retry.on_click(lambda _: self.restart())

        header = w.HBox([self._title, self._lang], layout=w.Layout(justify_content="space-between", width="100%"))
        super().__init__(children=[
            w.HTML(_STYLE),
            header,
            w.HBox([self._bar, self._progress]),
            self._question,
            self._exhibit,
            self._answer,
            w.HBox([self._check, self._next, self._retry]),
            self._feedback,
            self._rerun,
        ], layout=w.Layout(border="1px solid var(--jp-border-color2, #ccc)", padding="0.5em 1em"))
        self.add_class("minialloc-quiz")
        self._show()

    # -- what the output holds where widgets cannot be drawn ------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        data = super()._repr_mimebundle_(**kwargs)
        if data is not None:
            data["text/plain"] = render_text(self.session)
        return data

    # -- actions (the buttons call these; tests call them too) ---------------------------------------------------
    def response(self) -> object:
        """What the student has entered for the current question."""
        kind = self.session.current.kind
        if kind == "single":
            return self._choice.value
        if kind == "multi":
            return {oid for oid, box in zip(self._option_ids(), self._boxes, strict=True) if box.value}
        return self._number.value

    def submit(self) -> Feedback | None:
        if self.session.finished:
            return None
        feedback = self.session.check(self.response())
        self._show_feedback(feedback)
        self._update_progress()
        if feedback.status != "invalid":
            self._next.disabled = False
            if feedback.correct:
                self._next.focus()
        return feedback

    def go_next(self) -> None:
        self.session.next()
        self._show()
        if not self.session.finished:
            self._focus_answer()
        else:
            self._retry.focus()

    def restart(self) -> None:
        self.session.retry()
        self._bar.max = self.session.total
        self._show()
        self._focus_answer()

    # -- drawing -------------------------------------------------------------------------------------------------
    def _on_lang(self, change: dict) -> None:
        self.session.set_lang(change["new"])
        keep = self.response() if not self.session.finished else None
        self._show(keep=keep)

    def _on_text_msg(self, _widget: w.Widget, content: dict, _buffers: list) -> None:
        if content.get("event") == "submit":
            self.submit()

    def _option_ids(self) -> list[str]:
        return [oid for oid, _ in self.session.current.options]

    def _show(self, keep: object = None) -> None:
        s, lang = self.session, self.session.lang
        self._title.value = f"<b>{html.escape(pick(s.title, lang))}</b>"
        self._check.description = ui("check", lang)
        self._retry.description = ui("retry", lang)
        self._rerun.value = f"<div style='font-size:85%;color:#555'>{html.escape(ui('rerun', lang))}</div>"
        self._update_progress()
        if s.finished:
            self._question.value = ""
            self._exhibit.value = ""
            self._answer.children = ()
            self._check.disabled = self._next.disabled = True
            self._next.description = ui("next", lang)
            self._feedback.value = f'<div role="status" aria-live="polite"><b>{html.escape(s.summary())}</b></div>'
            return
        item = s.current
        last_one = s.state.index == s.total - 1
        self._next.description = ui("finish" if last_one else "next", lang)
        self._question.value = f"<div>{to_html(pick(item.text, lang))}</div>"
        # pre-wrap: PyTorch's OOM message is one long line; wrapped, it is read without scrolling sideways
        style = "font-size:0.85em;line-height:1.25;white-space:pre-wrap"
        self._exhibit.value = f"<pre style='{style}'>{html.escape(item.exhibit)}</pre>" if item.exhibit else ""
        labels = [to_plain(pick(text, lang)) for _, text in item.options]
        if item.kind == "single":
            self._choice.options = list(zip(labels, self._option_ids(), strict=True))
            self._choice.value = keep if keep in self._option_ids() else None
            self._choice.description = ""
            self._answer.children = (self._choice,)
        elif item.kind == "multi":
            ticked = keep if isinstance(keep, set) else set()
            self._boxes = [w.Checkbox(value=oid in ticked, description=label, indent=False, layout=_FULL)
                           for oid, label in zip(self._option_ids(), labels, strict=True)]
            self._many.children = tuple(self._boxes)
            self._hint.value = f"<i>{html.escape(ui('select_all', lang))}</i>"
            self._answer.children = (self._hint, self._many)
        else:
            self._number.value = keep if isinstance(keep, str) else ""
            self._number.placeholder = ui("your_answer", lang)
            unit = ui("answer_in", lang, unit=pick(item.unit, lang)) if item.unit else ""
            self._hint.value = f"<i>{html.escape(unit + ' ' + ui('enter_hint', lang))}</i>"
            self._answer.children = (self._number, self._hint)
        self._check.disabled = False
        checked = item.qid in s.state.last
        self._next.disabled = not checked
        if checked:
            self._show_feedback(s.feedback(item.qid))
        else:
            self._feedback.value = ""

    def _show_feedback(self, feedback: Feedback) -> None:
        color = {"correct": "var(--jp-success-color1, #2e7d32)", "wrong": "var(--jp-error-color1, #c62828)"}
        style = f"color:{color[feedback.status]}" if feedback.status in color else ""
        mark = {"correct": "✔ ", "wrong": "✘ "}.get(feedback.status, "")
        body = f"<p><b style='{style}'>{mark}{html.escape(feedback.message)}</b></p>"
        if feedback.explanation:
            body += f"<p>{to_html(feedback.explanation)}</p>"
        self._feedback.value = f'<div role="status" aria-live="polite">{body}</div>'

    def _update_progress(self) -> None:
        s = self.session
        self._bar.value = min(s.answered, s.total)
        self._progress.value = s.summary() if s.finished else s.progress()

    def _focus_answer(self) -> None:
        kind = self.session.current.kind
        target = {"single": self._choice, "multi": self._boxes[0] if self._boxes else None}.get(kind, self._number)
        if target is not None:
            target.focus()
