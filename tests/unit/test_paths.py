"""The path rules of the path-aware skip (core.paths): which changed files can move a suite's numbers."""

from __future__ import annotations

import re

import pytest

from rl_verify.core import paths


@pytest.mark.parametrize(("path", "pattern", "expected"), [
    ("docs/en/index.rst", "docs/**", True),
    ("docs", "docs/**", False),  # the folder itself is no file under it
    ("xtuner/docs/x.py", "docs/**", False),  # anchored at the checkout's root
    ("README.md", "**/*.md", True),  # '**/' matches no folder at all
    ("xtuner/v1/rl/README.md", "**/*.md", True),
    ("xtuner/v1/rl/README.mdx", "**/*.md", False),
    ("xtuner/v1/rl/grpo.py", "xtuner/*/rl/*.py", True),
    ("xtuner/v1/rl/sub/grpo.py", "xtuner/*/rl/*.py", False),  # '*' stops at '/'
    ("xtuner/v1/rl/sub/grpo.py", "xtuner/**/*.py", True),
    ("a1.py", "a?.py", True),
    ("a/.py", "a?.py", False),
    ("v3.py", "v[0-9].py", True),
    ("v-.py", "v[0-9].py", False),
    ("va.py", "v[!0-9].py", True),
    ("v7.py", "v[!0-9].py", False),
    ("a+b(c).py", "a+b(c).py", True),  # regex characters are literal
    ("axb(c).py", "a.b(c).py", False),
])
def test_a_pattern_matches_whole_paths_as_the_module_says(path, pattern, expected):
    assert paths.matches(path, [pattern]) is expected


def test_by_default_only_docs_markdown_ci_and_tests_cannot_affect_a_suite():
    changed = ["docs/zh/rl.md", "README.md", ".github/workflows/ci.yml", "tests/rl/test_grpo.py",
               "xtuner/v1/rl/loss.py", "setup.py", "requirements/runtime.txt", "examples/v1/config/rl_grpo.py"]
    assert paths.affecting(changed) == ["xtuner/v1/rl/loss.py", "setup.py", "requirements/runtime.txt",
                                        "examples/v1/config/rl_grpo.py"]


def test_a_docs_only_diff_affects_nothing_and_an_empty_diff_affects_nothing():
    assert paths.affecting(["docs/en/a.md", "CONTRIBUTING.md", ".github/CODEOWNERS"]) == []
    assert paths.affecting([]) == []


def test_a_suites_own_affects_narrows_and_unaffecting_widens_what_is_skipped():
    changed = ["xtuner/v1/model/moe.py", "xtuner/v1/rl/grpo/loss.py", "xtuner/v1/rl/utils.py"]
    assert paths.affecting(changed, affects=["xtuner/v1/rl/**"], unaffecting=["xtuner/v1/rl/utils.py"]) == [
        "xtuner/v1/rl/grpo/loss.py"]


def test_each_changed_path_is_listed_once_in_the_order_given():
    assert paths.affecting(["b.py", "a.py", "b.py"]) == ["b.py", "a.py"]


@pytest.mark.parametrize(("pattern", "says"), [
    ("", "is empty"),
    ("   ", "is empty"),
    ("/xtuner/**", "relative to the checkout's root"),
    ("xtuner\\v1", "relative to the checkout's root"),
    ("xtuner/../docs/**", "'.' or '..' folder"),
    ("./docs/**", "'.' or '..' folder"),
    ("v[0-9.py", "unclosed '\\[' class"),
])
def test_an_unusable_pattern_is_named_with_its_field_and_fix(pattern, says):
    problems = paths.pattern_problems(["docs/**", pattern], "affects")
    assert len(problems) == 1 and problems[0].startswith(f"affects: {pattern!r}")
    assert re.search(says, problems[0])
    with pytest.raises(paths.PatternError, match="pattern"):
        paths.matches("x.py", [pattern])


def test_the_defaults_are_usable_patterns():
    assert paths.pattern_problems(paths.DEFAULT_AFFECTS, "affects") == []
    assert paths.pattern_problems(paths.DEFAULT_UNAFFECTING, "unaffecting") == []


def test_a_module_or_package_at_the_checkouts_root_always_affects_it_shadows_imports():
    # the launch puts the checkout's root first on the module path: a new subprocess.py is every `import subprocess`
    assert paths.affecting(["subprocess.py", "json/__init__.py", "tools/x.py"], ["xtuner/**"], ["docs/**"]) == \
        ["subprocess.py", "json/__init__.py"]
