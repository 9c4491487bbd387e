"""The README documents every setting, and names no setting that does not exist."""

import re
from pathlib import Path

from nmbatch.service.config import Settings

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def bench_variables() -> set[str]:
    """``NMBATCH_*`` environment variables the benchmark reads (not service settings)."""
    found: set[str] = set()
    for path in (REPO / "engine" / "bench").glob("*.py"):
        found |= set(re.findall(r"NMBATCH_[A-Z][A-Z_]*[A-Z]", path.read_text(encoding="utf-8")))
    return found


def harness_variables() -> set[str]:
    """``NMBATCH_*`` variables of the test harness (the Makefile, the tests' conftest files)."""
    paths = [REPO / "Makefile", *(REPO / "tests").rglob("conftest.py")]
    found: set[str] = set()
    for path in paths:
        found |= set(re.findall(r"NMBATCH_[A-Z][A-Z_]*[A-Z]", path.read_text(encoding="utf-8")))
    return found


def test_every_setting_is_in_the_readme_settings_table() -> None:
    text = README.read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(NMBATCH_[A-Z_]+)` \|", text, re.MULTILINE))
    fields = {"NMBATCH_" + name.upper() for name in Settings.model_fields}
    assert fields - rows == set(), "settings missing from the README's table"


def test_the_readme_names_only_real_settings() -> None:
    text = README.read_text(encoding="utf-8")
    named = set(re.findall(r"NMBATCH_[A-Z][A-Z_]*[A-Z]", text))
    fields = {"NMBATCH_" + name.upper() for name in Settings.model_fields}
    assert named - fields - bench_variables() - harness_variables() == set()
