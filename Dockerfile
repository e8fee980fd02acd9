# trtspec on NVIDIA's Triton + TensorRT-LLM container. One Dockerfile, two flavours, chosen by BASE:
#
#   engine: tensorrt_llm (trtllm-build engines + the C++ tensorrtllm backend): TensorRT-LLM 0.17.0 - 1.2.1,
#     containers up to tritonserver:26.07-trtllm-python-py3 (the default below, 25.12, has TensorRT-LLM 1.1.0);
#   engine: llmapi (the LLM API's PyTorch backend, no engine build): containers whose TensorRT-LLM trtspec has
#     validated field lists for (1.2: tritonserver 26.04 - 26.07; `trtspec doctor` names the flavours the
#     installed version runs).
#
#   docker build -t trtspec:25.12 .
#   docker build -t trtspec:llmapi --build-arg BASE=nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3 .
#   docker run --rm -it --gpus all --shm-size=2g --ulimit memlock=-1 --ulimit stack=67108864 \
#       -v /models:/models -v $PWD/trtspec-out:/workspace/trtspec-out -p 8000-8002:8000-8002 \
#       trtspec:25.12 build build_configs/llama-3.1-70b_llama-3.2-1b_h200_fp8.yaml
#
# The base image already has torch, tensorrt_llm (with ModelOpt), transformers, tritonserver and the
# tensorrtllm backend. trtspec goes on top without touching them: every package already installed is
# pinned to its installed version (a constraints file made from `pip list`), so pip adds only what is
# missing (click, rich, pydantic, ...) and fails loudly instead of swapping torch or TensorRT-LLM for
# another build. No `reference` extra: the container's torch/transformers serve the reference engine too.
ARG BASE=nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3
FROM ${BASE}

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/trtspec
COPY pyproject.toml README.md ./
COPY trtspec ./trtspec
COPY model_repository ./model_repository
COPY build_configs ./build_configs
COPY scripts ./scripts

RUN python3 -m pip list --format=freeze | grep -viE '^trtspec==' > /tmp/base-constraints.txt \
 && python3 -m pip install -c /tmp/base-constraints.txt /opt/trtspec \
 && (python3 -m pip check || echo "note: pip check reports conflicts that predate trtspec (base image)") \
 && python3 -c "import importlib.metadata as m; print('trtspec', m.version('trtspec'), '| tensorrt_llm', m.version('tensorrt_llm'))" \
 && trtspec --version

# trtspec converts checkpoints with TensorRT-LLM's own example scripts (convert_checkpoint.py,
# quantize.py). NVIDIA's images have shipped them at /app/tensorrt_llm/examples or /app/examples; when
# neither exists, fetch examples/ of exactly the installed TensorRT-LLM release (sparse, no LFS blobs).
RUN set -e; \
    if [ -f /app/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py ] \
       || [ -f /app/examples/models/core/llama/convert_checkpoint.py ]; then \
        echo "TensorRT-LLM examples present"; \
    else \
        v=$(python3 -c "import importlib.metadata as m; print(m.version('tensorrt_llm'))"); \
        command -v git >/dev/null || (apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*); \
        GIT_LFS_SKIP_SMUDGE=1 git clone --depth 1 --filter=blob:none --sparse --branch "v${v}" \
            https://github.com/NVIDIA/TensorRT-LLM.git /opt/tensorrt_llm_src; \
        git -C /opt/tensorrt_llm_src sparse-checkout set examples; \
        mkdir -p /app/tensorrt_llm; ln -s /opt/tensorrt_llm_src/examples /app/tensorrt_llm/examples; \
    fi

# Build configs, outputs and the model repository live here; mount /models for the HF checkpoints.
WORKDIR /workspace
RUN cp -r /opt/trtspec/build_configs /workspace/build_configs
EXPOSE 8000 8001 8002
ENTRYPOINT ["trtspec"]
CMD ["--help"]
