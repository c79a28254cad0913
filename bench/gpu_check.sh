#!/usr/bin/env bash
# The checks to run first whenever a GPU is at hand, in under 8 minutes: the CUDA tests and the GPU benchmarks, with
# every record written under $OUT (default bench/out). Usage: bash bench/gpu_check.sh [label]   (label: e.g. h100)
set -uo pipefail
cd "$(dirname "$0")/.."
label=${1:-$(python -c "import torch; print(torch.cuda.get_device_name(0).split()[1].lower())" 2>/dev/null || echo gpu)}
out=${OUT:-bench/out}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
nvidia-smi > "$out/gpu-$label-smi.txt" 2>&1
timeout 240 python -m pytest -m gpu -n 0 -q -p no:cacheprovider 2>&1 | tee "$out/gpu-$label-tests.log" | tail -15
# The GPU's rates go into the table that prices `pgrank plan`: the package's own, or with OUT set (a lent machine
# whose working tree does not come back) a copy of it under $OUT.
rates=pgrank/pipeline/measured_rates.yaml
if [ -n "${OUT:-}" ]; then cp "$rates" "$out/measured_rates.yaml" && rates="$out/measured_rates.yaml"; fi
timeout 200 python bench/gpu.py --seconds 1.5 --out "$out/gpu-$label.json" --rates "$rates" 2>&1 | tail -40
