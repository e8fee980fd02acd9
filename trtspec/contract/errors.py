"""Error kinds between the loop and its callers: one type per kind, one encoding on the wire, decoded here.

A kind is the error's type (`RequestError` is a bad request, `ProcessDied` a model process that died under a call,
`Overloaded` a full queue, `Cancelled` a request the deployment cancelled); anything else is a failure of the
deployment. Triton's streamed errors carry only a message (a gRPC stream client gets no status code), so the kind
travels as the message's first words, "<kind>: <what happened>" ("bad request: text_input is empty"), and a caller
(the loop, reading an engine's answer; the OpenAI API, reading the loop's) reads it back with `decode`, which also
knows the message Triton's Python backend gives for a model whose stub process died.
"""

from __future__ import annotations

from enum import Enum


class ErrorKind(Enum):
    BAD_REQUEST = "bad request"  # the client's mistake: the message says which field and why
    PROCESS_DIED = "process died"  # a model process died under the request: retry once it is reloaded
    OVERLOADED = "overloaded"  # no room for the request now: retry later
    CANCELLED = "cancelled"  # the deployment cancelled the request
    FAILED = "failed"  # any other failure of the deployment (no tag on the wire)


class SpecError(Exception):
    """An error whose kind the loop's callers act on (HTTP status, retry, fall back)."""

    kind = ErrorKind.FAILED


class RequestError(SpecError, ValueError):
    """A bad request: the client gets this message as an error response, the server stays up."""

    kind = ErrorKind.BAD_REQUEST


class Cancelled(SpecError):
    kind = ErrorKind.CANCELLED


class EngineCallError(SpecError, RuntimeError):
    """An engine call (a BLS request to the target or draft model) failed."""


class ProcessDied(EngineCallError):
    """The called model's process died during the call (trtspec.triton.callees) or before it (Triton's answer)."""

    kind = ErrorKind.PROCESS_DIED


class Overloaded(EngineCallError):
    """No room for the request now (an engine's queue is full): retry later."""

    kind = ErrorKind.OVERLOADED


#: what Triton's Python backend answers for a model whose stub process died (python_be.cc): "Stub process
#: '<model>_0_0' is not healthy."
_DEAD_STUB = ("Stub process '", "' is not healthy")
_TAGGED = [k for k in ErrorKind if k is not ErrorKind.FAILED]


def kind_of(error: BaseException) -> ErrorKind:
    return getattr(error, "kind", ErrorKind.FAILED)


def encode(error: BaseException, where: str = "") -> str:
    """The wire message of `error`: its kind's tag, then `where` (the model that answers), then its message."""
    kind = kind_of(error)
    text = f"{where}: {error}" if where else str(error)
    return text if kind is ErrorKind.FAILED else f"{kind.value}: {text}"


def decode(message: str) -> tuple[ErrorKind, str]:
    """(kind, the message after its tag) of a wire message, wrapped by Triton or not ("in ensemble 'ensemble',
    bad request: ..."): the first tag at the start of the message or of one of its ", "- or ": "-parts."""
    found = []
    for kind in _TAGGED:
        tag = f"{kind.value}: "
        at = 0 if message.startswith(tag) else min(
            (i + len(sep) for sep in (", ", ": ") if (i := message.find(sep + tag)) >= 0), default=-1)
        if at >= 0:
            found.append((at, kind, message[at + len(tag):]))
    if found:
        _, kind, detail = min(found, key=lambda f: f[0])
        return kind, detail
    start = message.find(_DEAD_STUB[0])
    if start >= 0 and message.find(_DEAD_STUB[1], start + len(_DEAD_STUB[0])) >= 0:
        return ErrorKind.PROCESS_DIED, message
    return ErrorKind.FAILED, message


_ENGINE_ERRORS = {ErrorKind.PROCESS_DIED: ProcessDied, ErrorKind.OVERLOADED: Overloaded}


def engine_error(model: str, message: str) -> EngineCallError:
    """The typed error of a call to `model` that answered `message`: its process died, it is overloaded, or it
    failed (an engine's bad request is the loop's, not the client's: it stays a failed call)."""
    kind, detail = decode(message)
    return _ENGINE_ERRORS.get(kind, EngineCallError)(f"{model}: {detail if kind in _ENGINE_ERRORS else message}")
