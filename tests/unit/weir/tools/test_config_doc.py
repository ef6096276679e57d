"""docs/configuration.md is the table generated from the settings classes, and the README points to it."""

from __future__ import annotations

from weir.core.config import SETTINGS, env_name
from weir.tools import config_doc


def test_the_committed_table_is_the_generated_one() -> None:
    assert config_doc.DOC.read_text(encoding="utf-8") == config_doc.render(), (
        "docs/configuration.md is stale: run `python -m weir.tools.config_doc`"
    )
    assert config_doc.main(["--check"]) == 0


def test_every_variable_has_a_row_with_a_meaning() -> None:
    text = config_doc.render()
    for settings in SETTINGS:
        for name, field in settings.model_fields.items():
            assert field.description, f"{env_name(name)} has no description"
            assert f"| `{env_name(name)}` |" in text


def test_the_readme_points_to_the_table() -> None:
    readme = (config_doc.DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    assert "docs/configuration.md" in readme
