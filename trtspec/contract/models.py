"""The names of a deployment's models, as clients and the repository use them.

Clients send text to the text endpoints (`ensemble` speculative, `baseline` target only), which run the loop in
process; NVIDIA's BLS clients and the OpenAI API send token ids to the loop models (`speculative`,
`baseline_loop`); the loops call the engines (`tensorrt_llm`, `tensorrt_llm_draft`). Where the target engine
speculates by itself for every request (Medusa), the target-only endpoints call a second target engine without the
heads (`tensorrt_llm_target_only`), so that target-only means target-only.
"""

TARGET, DRAFT = "tensorrt_llm", "tensorrt_llm_draft"
TARGET_ONLY = "tensorrt_llm_target_only"
LOOP, BASELINE_LOOP = "speculative", "baseline_loop"
ENSEMBLE, BASELINE = "ensemble", "baseline"  # the text endpoints (model_repository/text)
PREPROCESSING, POSTPROCESSING = "preprocessing", "postprocessing"

# Where requests enter, each counted once: Triton clients send text to the text endpoints (which run the loop
# in-process); the OpenAI API sends token ids to the loop models.
ENTRY_MODELS = (ENSEMBLE, BASELINE, LOOP, BASELINE_LOOP)
#: text endpoint -> the loop model that serves the same requests as token ids
LOOP_OF = {ENSEMBLE: LOOP, BASELINE: BASELINE_LOOP}
# After a model process dies (trtspec.server.watchdog): the engines are reloaded alone, as only the loop models call
# them and a loop's call on a dead engine ends at once; the endpoints serve without the draft engine meanwhile.
ENGINE_MODELS = (TARGET, DRAFT, TARGET_ONLY)
TARGET_ENGINES = (TARGET, TARGET_ONLY)  # a deployment's target steps, whichever endpoint asked for them
RELOADABLE_MODELS, OPTIONAL_MODELS = ENGINE_MODELS, (DRAFT,)
