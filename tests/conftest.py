import os
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

# Markers are given here, by file and test name, so one place says what each part of the suite needs and how to
# leave it out (`make check` runs `-m "not notebooks and not nbgrader and not browser and not slow"`). The names are
# registered in pyproject.toml.
MARKED_FILES = {
    "notebooks": {"test_notebooks.py", "test_course_exercises.py", "test_capstone.py", "test_binder.py"},
    "nbgrader": {"test_labs.py", "test_nbgrader_hostile.py", "test_sandbox.py", "test_quiz_graded.py",
                 "test_cert_gradebook.py", "test_sandbox_packages.py", "test_grading_browser.py",
                 "test_grading_batch.py", "test_grading_intake.py", "test_sandbox_proc.py",
                 "test_parallel_grading.py", "test_jupyterhub.py"},
    "browser": {"test_browser.py", "test_grading_browser.py"},
    "slow": {"test_binder.py", "test_wheel_contents.py", "test_jupyterhub.py"},
    "gpu": {"test_cuda_device.py", "test_cupy_allocator.py"},
}
# single tests that need what their file as a whole does not (file name, test function name, every parameter)
MARKED_TESTS = {
    "notebooks": {("test_viz.py", "test_in_a_notebook_each_plot_shows_once_and_the_stepper_exports_a_png")},
    "nbgrader": {("test_i18n.py", "test_lab_round_trip_translate_build_grade_check"),
                 ("test_privacy.py", "test_a_grading_command_on_a_readable_course_refuses_with_the_fix")},
    # the slowest of the rest (several seconds each, most starting a Python with torch or a compiler), so that
    # `make check` stays under a minute; `make test` still runs them
    "slow": {
        ("test_labgrade.py", "test_cells_keep_the_kernels_timeout_semantics"),
        ("test_serving.py", "test_waste_shares_add_up"),
        ("test_learn.py", "test_pinned_counts_only_live_blocks"),
        ("test_learn.py", "test_who_holds_names_the_slip"),
        ("test_i18n.py", "test_round_trip_translate_build_check"),
        ("test_i18n.py", "test_untranslated_structure_stale_and_orphan_fail_the_check"),
        ("test_replay.py", "test_pytorch_memory_viz_reads_minialloc_snapshots"),
        ("test_snapshot.py", "test_memory_viz_plots_write_html_offline"),
        ("test_snapshot.py", "test_memory_viz_stats_reads_fixture"),
        ("test_snapshot.py", "test_memory_viz_trace_reads_a_minialloc_snapshot"),
        ("test_snapshot.py", "test_memory_viz_trace_reads_fixture"),
        ("test_kernels.py", "test_the_gpu_tests_attention_cases_pass_on_the_emulation"),
        ("test_kernels.py", "test_the_attention_comparison_catches_a_broken_kernel"),
        ("test_kernels.py", "test_a_cooperative_kernel_registered_as_plain_raises"),
        ("test_kernels.py", "test_every_kernel_compiles_to_ptx"),
        ("test_real_snapshots.py", "test_cli_check_and_replay_on_a_real_file"),
        ("test_real_snapshots.py", "test_the_timeline_starts_from_the_state_at_the_first_entry"),
        ("test_real_snapshots.py", "test_replay_from_the_rebuilt_state_lands_every_allocation_at_its_recorded_address"),
        ("test_real_snapshots.py", "test_state_at_trace_start_is_public_and_in_the_snapshot_schema"),
        ("test_serving.py", "test_paged_beats_contiguous_as_the_paper_measures_on_the_default_workload"),
        ("test_gpu_check.py", "test_dry_run_prints_one_table_and_passes"),
        ("test_gpu_check.py", "test_without_torch_and_cupy_it_says_so_in_one_line_and_still_prints_the_table"),
        ("test_kernels.py", "test_the_comparison_catches_a_missing_stride_and_a_missing_atomic"),
        ("test_cert_credential.py", "test_rdfc_round_trip_and_any_change_fails"),
        ("test_grading_sanitize.py", "test_export_quotes_every_field_and_forges_no_row"),
        ("test_compaction.py", "test_defragment_makes_a_failing_request_fit"),
        ("test_compaction.py", "test_release_empty_gives_whole_segments_back"),
        ("test_diagnose.py", "test_diagnose_a_real_training_step_at_its_peak"),
        ("test_i18n.py", "test_lab_changed_english_goes_fuzzy_and_fails_the_check"),
        ("test_real_snapshots.py",
         "test_a_device_smaller_than_the_reserved_start_and_settings_that_do_not_match_the_run"),
        # integration by nature: each runs whole programs in fresh processes (the four labs' solutions in the
        # sandbox, twice each; the CLI and quizzes verify as subprocesses) or the host compiler
        ("test_labgrade.py", "test_every_scored_labs_solution_passes_on_fresh_inputs"),
        ("test_diagnose.py", "test_a_closed_pipe_ends_the_command_quietly"),
        ("test_cert_cli.py", "test_verify_in_a_real_process_prints_no_traceback"),
        ("test_kernels.py", "test_emulation_refuses_what_would_hang_or_be_undefined_on_a_gpu"),
        ("test_kernels.py", "test_kernels_and_header_compile_cleanly_as_host_cpp"),
        ("test_chapter7.py", "test_the_real_run_fails_on_8_gib_and_its_fix_is_measured_by_replay"),
    },
}


SPREAD_FILES = {"test_course_exercises.py", "test_notebooks.py"}


def _needs_a_gpu(item: pytest.Item) -> bool:
    """A test that skips without CUDA is a GPU test, wherever it lives (its skipif names the GPU or CUDA)."""
    for mark in item.iter_markers("skipif"):
        reason = str(mark.kwargs.get("reason", ""))
        if "GPU" in reason or "CUDA" in reason or "cuda" in reason:
            return True
    return False


# tryfirst: pytest-xdist reads the xdist_group marks in a collection hook of its own; the marks must be there
# first, whatever order the plugins were registered in
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        file = Path(str(item.fspath)).name
        name = getattr(item, "originalname", item.name)
        for marker, files in MARKED_FILES.items():
            if file in files:
                item.add_marker(marker)
        for marker, tests in MARKED_TESTS.items():
            if (file, name) in tests:
                item.add_marker(marker)
        if _needs_a_gpu(item):
            item.add_marker("gpu")
        # `make test` runs the suite on two workers (pytest-xdist, --dist loadgroup): a file's tests stay together
        # on one worker, so its module fixtures (a graded course, a JupyterLab server) are built once; the chapter
        # and notebook runs, each in its own scratch folder, spread over both
        if file not in SPREAD_FILES:
            item.add_marker(pytest.mark.xdist_group(file))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `-m "not A and not B ..."` (`make check`'s form), a file MARKED_FILES gives one of A, B... is not even
    imported: every test in it would be deselected anyway, and importing them (nbgrader, Playwright, nbconvert)
    cost seconds of each `make check`. Any other expression collects every file, as pytest does."""
    terms = [t.strip() for t in (config.getoption("markexpr", "") or "").split(" and ")]
    if not all(t.startswith("not ") and t[4:].strip().isidentifier() for t in terms):
        return None
    excluded = {t[4:].strip() for t in terms}
    if any(collection_path.name in MARKED_FILES.get(marker, ()) for marker in excluded):
        return True
    return None


@pytest.fixture(autouse=True)
def _no_env_config(monkeypatch):
    """Tests choose their allocator config explicitly; a developer's MINIALLOC_ALLOC_CONF must not leak in."""
    monkeypatch.delenv("MINIALLOC_ALLOC_CONF", raising=False)


@pytest.fixture
def english_by_default(monkeypatch: pytest.MonkeyPatch):
    """minialloc in English, whatever the shell's MINIALLOC_LANG or an earlier test set; the language reset after."""
    from minialloc import learn
    from minialloc.lang import set_lang

    monkeypatch.delenv("MINIALLOC_LANG", raising=False)
    set_lang(None)
    learn.reset()
    yield
    set_lang(None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Under `--dist loadgroup` a worker's pytest-xdist appends "@group" to each grouped test's id. When none has it,
    the groups are silently ignored and a file's module fixtures race on both workers (the binder venv did, in CI):
    stop before any test runs, saying why."""
    grouped = [i for i in ids if Path(i.split("::")[0]).name not in SPREAD_FILES]
    if node.config.getoption("dist", None) == "loadgroup" and grouped and not any("@" in i for i in grouped):
        pytest.exit(f"pytest-xdist's --dist loadgroup does not group tests on pytest {pytest.__version__} "
                    "(pytest-xdist#1386): reinstall the dev extra (`make test` does; it pins pytest<9.2)", returncode=4)
