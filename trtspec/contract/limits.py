"""A request's limits in a deployment, checked in one place: the loop, the OpenAI API and the llmapi model call
`RequestLimits.check` with what they know of the request. The build config and preflight check the build's own
settings (a request's default draft length, the schedule) against the same bound at build time."""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.contract.errors import RequestError
from trtspec.contract.fields import NUM_DRAFT_TOKENS


class LimitError(RequestError):
    """A request over one of the deployment's limits; `field` is the request field to change."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class RequestLimits:
    """What a deployment's engines were built for."""

    max_k: int  # draft tokens one target call verifies at most (the build config's max_draft_len)
    max_input_len: int | None = None  # prompt + max_tokens: the loop resends the running sequence; None: unchecked

    def check(self, prompt_tokens: int | None, max_tokens: int | None, k: int | None) -> None:
        """Raises LimitError naming the limit a request is over; `k`: the draft length it asks for; None: not known
        here, not checked."""
        if k is not None and k > self.max_k:
            raise LimitError(f"{NUM_DRAFT_TOKENS} {k} is larger than max_draft_len {self.max_k}: this "
                             f"deployment's target verifies at most {self.max_k} draft tokens per call",
                             NUM_DRAFT_TOKENS)
        if self.max_input_len is None or prompt_tokens is None or max_tokens is None:
            return
        total, limit = prompt_tokens + max_tokens, self.max_input_len
        if total > limit:
            raise LimitError(f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} exceeds "
                             f"max_input_len {limit}, this deployment's limit of {limit} tokens (the loop resends "
                             "the running sequence to the engines each iteration): shorten the prompt, lower "
                             "max_tokens, or rebuild with a larger limits.max_input_len", "max_tokens")
