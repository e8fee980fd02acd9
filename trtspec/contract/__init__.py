"""The one home of the speculative loop's interface: request fields, response statistics, error
kinds.

Every other place (Triton configs, the BLS model, the client, `trtspec infer`, the bench, Prometheus) derives
its names, types and checks from the tables here. NVIDIA's own declared interfaces, per TensorRT-LLM version,
live beside them in `trtspec.contract.nvidia`.
"""

from trtspec.contract.errors import (
    Cancelled,
    EngineCallError,
    ErrorKind,
    Overloaded,
    ProcessDied,
    RequestError,
    SpecError,
)
from trtspec.contract.fields import (
    DRAFT_LENGTH_POLICIES,
    LOOP_TOKEN_INPUTS,
    MAX_TOP_LOG_PROBS,
    NUM_DRAFT_TOKENS,
    REQUEST_FIELDS,
    RESPONSE_OUTPUTS,
    RESPONSE_STATS,
    STAT,
    Output,
    RequestField,
    Stat,
    field_by_name,
    stat_by_name,
)

__all__ = [
    "Cancelled",
    "EngineCallError",
    "ErrorKind",
    "Overloaded",
    "ProcessDied",
    "SpecError",
    "DRAFT_LENGTH_POLICIES",
    "LOOP_TOKEN_INPUTS",
    "MAX_TOP_LOG_PROBS",
    "NUM_DRAFT_TOKENS",
    "REQUEST_FIELDS",
    "RESPONSE_OUTPUTS",
    "RESPONSE_STATS",
    "STAT",
    "RequestError",
    "Output",
    "RequestField",
    "Stat",
    "field_by_name",
    "stat_by_name",
]
