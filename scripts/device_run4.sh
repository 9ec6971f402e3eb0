#!/usr/bin/env bash
# Second GPU run for the plugins: the trainers on CUDA (log kept this time), where plain
# decoding differs from HF in float32 and by how much, and `lightspec bench` per workload at
# batch 1 (3 prompts, 2 rounds, no HF baselines) for the plugin strategies. About 4 minutes.
#   carry: .whl (as device_run3.sh). Results: $OUT/results4.tar.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:?}
R=$(mktemp -d /tmp/lsres.XXXX); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1 || { cat $R/pip.log; exit 1; }
SRC=$PWD/lightspec_core/src:$PWD/kernels/src:$PWD/zoo/src
for p in plugins/*/src; do SRC=$SRC:$PWD/$p; done
export PYTHONPATH=$SRC:/tmp/site
( timeout 150 python3 scripts/gpu_train_checks.py --device cuda --json $R/train_cuda.json > $R/train.log 2>&1; echo "train rc=$?" >> $R/status.txt ) &
TRAIN=$!
timeout 70 python3 scripts/gpu_plugin_checks.py --dtypes float32 --diagnose --json $R/diagnose.json > $R/diagnose.log 2>&1; echo "diagnose rc=$?" >> $R/status.txt
wait $TRAIN
tar -C $R -cf $OUT/results4.tar .
echo "[$(el)s] bench"
P=zoo/src/lightspec_zoo/prompts
for f in $P/code.jsonl $P/docstring.jsonl $P/edit.jsonl $P/prose.jsonl $P/spec_bench/question.jsonl; do
  w=$(basename $(dirname $f))_$(basename $f .jsonl)
  timeout 40 python3 -m lightspec_core.cli bench --device cuda --dtype float32 --prompts $f --limit 3 --repeat 2 --no-hf \
    --max-new-tokens 64 --strategy none --strategy ngram --strategy draft_model --strategy hybrid --strategy eagle3 \
    --strategy eagle3_tree --strategy dspark --strategy mtp --strategy docs/examples/union.yaml \
    --json $R/bench_$w.json > $R/bench_$w.log 2>&1; echo "bench $w rc=$?" >> $R/status.txt
  tar -C $R -cf $OUT/results4.tar .
done
cat $R/status.txt; cut -c1-400 $R/diagnose.log; cut -c1-700 $R/train.log
for f in $R/bench_*.log; do grep -A11 "^==" $f | cut -c1-150; done
echo "[$(el)s] done"
