"""Error kinds travel between the loop and its callers as types, one encoding on the wire (trtspec.contract.errors)."""

import pytest

from trtspec.contract.errors import (
    Cancelled, EngineCallError, ErrorKind, Overloaded, ProcessDied, RequestError, decode, encode, engine_error,
)
from trtspec.openai.backend import openai_error

KINDS = [(RequestError, ErrorKind.BAD_REQUEST), (ProcessDied, ErrorKind.PROCESS_DIED),
         (Overloaded, ErrorKind.OVERLOADED), (Cancelled, ErrorKind.CANCELLED), (EngineCallError, ErrorKind.FAILED)]


@pytest.mark.parametrize("cls,kind", KINDS)
def test_every_kind_decodes_as_it_was_encoded_bare_or_wrapped_by_triton(cls, kind):
    message = encode(cls("tensorrt_llm: what happened"), "ensemble")
    assert decode(message) == (kind, "ensemble: tensorrt_llm: what happened")
    wrapped = f"in ensemble 'ensemble', {message}"
    assert decode(wrapped) == (kind, wrapped if kind is ErrorKind.FAILED else "ensemble: tensorrt_llm: what happened")


def test_the_wire_form_of_a_bad_request_is_what_triton_clients_always_read():
    assert encode(RequestError("text_input is empty")) == "bad request: text_input is empty"
    assert encode(EngineCallError("the loop produced no output"), "speculative") == \
        "speculative: the loop produced no output"  # a failure carries no tag


def test_the_first_tag_wins_and_a_tag_inside_a_word_is_not_one():
    assert decode("bad request: stop: 'cancelled: ' never matches")[0] is ErrorKind.BAD_REQUEST
    assert decode("speculative: unoverloaded: x")[0] is ErrorKind.FAILED


def test_tritons_dead_stub_message_is_a_dead_process():
    message = "tensorrt_llm: Stub process 'tensorrt_llm_0_0' is not healthy."
    assert decode(message) == (ErrorKind.PROCESS_DIED, message)
    assert decode("Stub process is fine")[0] is ErrorKind.FAILED


def test_an_engines_answer_becomes_a_typed_engine_call_error():
    assert type(engine_error("tensorrt_llm", "Stub process 'tensorrt_llm_0_0' is not healthy.")) is ProcessDied
    e = engine_error("tensorrt_llm", encode(Overloaded("the queue is full")))
    assert type(e) is Overloaded and str(e) == "tensorrt_llm: the queue is full"
    # the engine refusing the loop's request is the deployment's failure, not the client's bad request
    assert type(engine_error("tensorrt_llm", encode(RequestError("input too long")))) is EngineCallError


@pytest.mark.parametrize("cls,status", [(RequestError, 400), (ProcessDied, 503), (Overloaded, 503),
                                        (Cancelled, 503), (EngineCallError, 500)])
def test_the_openai_api_answers_each_kind_with_its_status(cls, status):
    assert openai_error(encode(cls("x"), "ensemble")).status == status
