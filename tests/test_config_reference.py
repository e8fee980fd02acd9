"""docs/configuration.md is generated from the build-config schema; it must not drift from it."""

from __future__ import annotations

import typing
from pathlib import Path

from pydantic import BaseModel

from trtspec.config import BuildConfig
from trtspec.config_reference import render

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
REGENERATE = "python -m trtspec.config_reference > docs/configuration.md"


def _paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"  # the YAML key
        out.append(key)
        sub = next((a for a in (field.annotation, *typing.get_args(field.annotation)) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is not None:
            out += _paths(sub, f"{key}.")
    return out


def test_checked_in_reference_matches_the_schema():
    assert DOC.read_text() == render(), f"docs/configuration.md is out of date with trtspec/config.py; run: {REGENERATE}"


def test_every_field_of_the_schema_is_in_the_reference():
    text = render()
    for path in _paths(BuildConfig):
        section, _, key = path.rpartition(".")
        assert f"## `{section}`" in text or not section, f"section {section} missing"
        assert f"| `{key}` |" in text, f"{path} missing from the reference"


def test_every_field_says_what_it_means():
    undocumented = []
    for line in render().splitlines():
        if line.startswith("| `") and line.rstrip().endswith("|  |"):
            undocumented.append(line.split("|")[1].strip())
    assert not undocumented, f"fields without a description in trtspec/config.py: {undocumented}"


def test_a_changed_default_is_drift(monkeypatch):
    from trtspec import config

    field = config.EngineLimits.model_fields["max_batch_size"]
    monkeypatch.setattr(field, "default", field.default + 1)
    assert render() != DOC.read_text()
