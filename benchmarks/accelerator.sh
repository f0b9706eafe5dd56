#!/usr/bin/env bash
# `make bench` on an accelerator: keras_xf against keras-hub under mixed_bfloat16 with Keras's
# flash-attention switch on, on JAX and PyTorch, each case in its own process and its own
# time limit, so that one failing case leaves the others' results. Then the training pair
# again at a size that fills a GPU better (8 layers, width 1024, sequence 1024, batch 32).
#
#     OUT=folder LABEL=h200 bash benchmarks/accelerator.sh
#
# writes OUT/LABEL_bench_<backend>.json, OUT/LABEL_large_<backend>.json and their logs. Where
# the machine's Python lacks keras or keras-hub, their wheels under .whl/ are installed into a
# temporary folder first (pip download them on a machine with a registry).
set -u
OUT=${OUT:-benchmarks/results}
LABEL=${LABEL:-gpu}
CASE_LIMIT=${CASE_LIMIT:-150}
CASES=${CASES:-train_interleaved generate_interleaved encode_interleaved}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ! python3 -c "import keras, keras_hub" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/keras_site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/keras_site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import keras, keras_hub, jax, torch; print('keras', keras.__version__, 'keras_hub', keras_hub.__version__, 'jax', jax.__version__, 'torch', torch.__version__)"
common=(--policy mixed_bfloat16 --flash-attention --rounds 3 --set MATMUL_SIZE=8192 --update)
large=(--set LAYERS=8 --set WIDTH=1024 --set HEADS=16 --set FFN=4096 --set SEQUENCE=1024
       --set BATCH=32)
for backend in jax torch; do
  for case in $CASES; do
    KERAS_BACKEND=$backend timeout "$CASE_LIMIT" python3 -m benchmarks.run "${common[@]}" \
      --cases "$case" --output "$OUT/${LABEL}_bench_$backend.json" \
      >>"$OUT/${LABEL}_bench_$backend.log" 2>&1 || echo "$backend $case failed or timed out"
  done
  tail -n 12 "$OUT/${LABEL}_bench_$backend.log"
done
for backend in jax torch; do
  KERAS_BACKEND=$backend timeout "$CASE_LIMIT" python3 -m benchmarks.run "${common[@]}" "${large[@]}" \
    --cases train_interleaved --output "$OUT/${LABEL}_large_$backend.json" \
    >>"$OUT/${LABEL}_large_$backend.log" 2>&1 || echo "$backend large training failed or timed out"
  tail -n 8 "$OUT/${LABEL}_large_$backend.log"
done
