"""The AIPerf request templates in scripts/aiperf/ render to requests the ensemble accepts.

AIPerf renders them with a Jinja2 environment with autoescape on, then parses the result as JSON; this
renders them the same way, with a prompt full of characters that HTML escaping or JSON quoting could break.
"""

import json
from pathlib import Path

import jinja2
import pytest

from trtspec.contract.fields import field_by_name

TEMPLATES = Path(__file__).resolve().parent.parent / "scripts" / "aiperf"
PROMPT = 'He said "<stop> & go",\n\tthen \\ left — 東京 \u2028'


def render(name: str, **variables) -> dict:
    template = jinja2.Environment(autoescape=True).from_string((TEMPLATES / name).read_text())
    return json.loads(template.render(**variables))


@pytest.mark.parametrize("name", ["triton-generate.json.j2", "triton-generate-deterministic.json.j2"])
@pytest.mark.parametrize("stream", [True, False])
def test_template_renders_a_request_the_ensemble_declares(name, stream):
    body = render(name, text=PROMPT, max_tokens=32, stream=stream)
    assert body["text_input"] == PROMPT
    assert body["max_tokens"] == 32 and body["stream"] is stream
    assert body["exclude_input_in_output"] is True  # genai-perf's tensorrtllm request sets it; AIPerf counts the output
    for key in body:
        field_by_name(key)  # KeyError: the ensemble does not declare it


def test_deterministic_template_asks_for_exactly_max_tokens():
    body = render("triton-generate-deterministic.json.j2", text="hi", max_tokens=17, stream=True)
    assert field_by_name("min_length") is field_by_name("min_tokens")
    assert body["min_length"] == body["max_tokens"] == 17
    assert "min_length" not in render("triton-generate.json.j2", text="hi", max_tokens=17, stream=True)


def test_template_without_an_output_length_leaves_max_tokens_to_the_server():
    assert "max_tokens" not in render("triton-generate.json.j2", text="hi", max_tokens=None, stream=False)
