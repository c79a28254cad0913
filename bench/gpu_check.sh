#!/usr/bin/env bash
# What to run first on a GPU at hand, in one call within 8 minutes: bench/gpu_check.py, with the wheels the lent image
# lacks (gathered here by `python3 bench/gpu_wheels.py` into .whl/, carried with the repository) installed offline,
# and every section's record written under $OUT (default bench/out) as the section ends. The GPU's rates go into the
# rates table: with OUT set (a lent machine whose working tree does not come back), a copy of it under $OUT.
# Usage: bash bench/gpu_check.sh [bench/gpu_check.py options]
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --find-links .whl --no-deps --no-compile --target /tmp/pgrank-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/pgrank-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
out=${OUT:-bench/out}
rates=pgrank/pipeline/measured_rates.yaml
if [ -n "${OUT:-}" ]; then cp "$rates" "$out/measured_rates.yaml" && rates="$out/measured_rates.yaml"; fi
timeout -s KILL 560 python3 bench/gpu_check.py --records "$out" --rates "$rates" "$@"
