"""A request's limits in a deployment are checked by one function (trtspec.contract.limits), which the loop, the
OpenAI API and the llmapi model call."""

import re

import pytest

from trtspec.contract import RequestError
from trtspec.contract.limits import LimitError, RequestLimits
from trtspec.llmapi import serving

LIMITS = RequestLimits(max_k=8, max_input_len=64)


def test_a_request_within_the_limits_passes():
    LIMITS.check(56, 8, 8)
    LIMITS.check(None, None, None)  # nothing known: nothing to check
    RequestLimits(max_k=4).check(10_000, 10_000, 4)  # no max_input_len: unchecked


@pytest.mark.parametrize("prompt,max_tokens,k,field,says", [
    (2, 4, 9, "num_draft_tokens", "num_draft_tokens 9 is larger than max_draft_len 8"),
    (60, 8, None, "max_tokens", "prompt (60 tokens) + max_tokens (8) = 68 exceeds max_input_len 64"),
])
def test_a_request_over_a_limit_is_a_bad_request_naming_the_field(prompt, max_tokens, k, field, says):
    with pytest.raises(LimitError, match=re.escape(says)) as e:
        LIMITS.check(prompt, max_tokens, k)
    assert isinstance(e.value, RequestError) and e.value.field == field


def test_the_llmapi_model_checks_num_draft_tokens_with_the_same_function():
    fields = {"text_input": "hello", "max_tokens": 4, "num_draft_tokens": 9}
    with pytest.raises(LimitError, match="num_draft_tokens 9 is larger than max_draft_len 8"):
        serving.parse(fields.get, 8)
