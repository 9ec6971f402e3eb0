#!/usr/bin/env bash
# The plugins of issues 26 and 27 on one H200 (their first GPU run): lossless checks of every
# plugin strategy against HF (float32 and bfloat16, batch 1 and 8, seeded sampling), the four
# trainers on CUDA with their heads in use, and `lightspec bench` on the GPU. About 6 minutes.
#   carry: .whl (wheels of the repo's packages, for their entry points, and stevedore)
# Results: $OUT/*.json, $OUT/*.log, $OUT/bench.md.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:?}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; lscpu | grep "Model name";
  python3 -c "import torch,triton,transformers,sys;print(sys.version.split()[0],torch.__version__,triton.__version__,transformers.__version__)"; } > $OUT/env.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1 || { cat $OUT/pip.log; exit 1; }
# the sources come first (edits since the wheels were built count); the wheels give the entry points
SRC=$PWD/lightspec_core/src:$PWD/kernels/src:$PWD/zoo/src
for p in plugins/*/src; do SRC=$SRC:$PWD/$p; done
export PYTHONPATH=$SRC:/tmp/site
cat $OUT/env.txt
echo "[$(el)s] plugin checks float32 + trainers (in parallel)"
( timeout ${TRAIN_S:-170} python3 scripts/gpu_train_checks.py --device cuda --json $OUT/train_cuda.json > $OUT/train.log 2>&1; echo "train rc=$?" >> $OUT/status.txt ) &
TRAIN=$!
timeout ${CHECK_S:-170} python3 scripts/gpu_plugin_checks.py --dtypes float32 --json $OUT/checks_fp32.json > $OUT/checks_fp32.log 2>&1; echo "checks fp32 rc=$?" >> $OUT/status.txt
wait $TRAIN
echo "[$(el)s] bench"
timeout ${BENCH_S:-150} python3 -m lightspec_core.cli bench --device cuda --dtype float32 --suite default --limit 2 --max-new-tokens 64 \
  --strategy none --strategy ngram --strategy draft_model --strategy hybrid --strategy eagle3 --strategy eagle3_tree \
  --strategy dspark --strategy mtp --strategy docs/examples/union.yaml --strategy docs/examples/showcase_tree.yaml \
  --json $OUT/bench.json --markdown $OUT/bench.md > $OUT/bench.log 2>&1; echo "bench rc=$?" >> $OUT/status.txt
echo "[$(el)s] plugin checks bfloat16"
timeout ${BF16_S:-60} python3 scripts/gpu_plugin_checks.py --dtypes bfloat16 --json $OUT/checks_bf16.json > $OUT/checks_bf16.log 2>&1; echo "checks bf16 rc=$?" >> $OUT/status.txt
cat $OUT/status.txt
grep -E "SUMMARY|PROBLEMS" $OUT/checks_*.log; grep -h '"error"\|"failures": [1-9]\|"identical": [0-7],' $OUT/checks_fp32.log | cut -c1-400 | head -20
cat $OUT/train.log | cut -c1-600
grep -B2 -A16 "==" $OUT/bench.log | cut -c1-170 | head -120; tail -5 $OUT/bench.log
echo "[$(el)s] done"
