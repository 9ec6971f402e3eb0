#!/usr/bin/env bash
# Second, short GPU session: lightspec bench (fp32, bf16) on the GPU-trained zoo model and the
# bf16 lossless check on two architectures. Results in $OUT/results2.tar.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=$(mktemp -d /tmp/lsres.XXXX); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-index .gpu_carry/*.whl > $R/pip.log 2>&1
export PYTHONPATH=$PWD/lightspec_core/src:$PWD/kernels/src:$PWD/zoo/src
for dt in float32 bfloat16; do
  echo "[$(el)s] bench $dt"
  timeout 75 python3 -m lightspec_core.cli bench --device cuda --dtype $dt --prompts zoo/src/lightspec_zoo/prompts/edit.jsonl --limit 2 \
    --max-new-tokens 48 --json $R/bench_$dt.json > $R/bench_$dt.log 2>&1; echo "bench $dt rc=$?" >> $R/status.txt
  tar -C $R -cf $OUT/results2.tar .
done
echo "[$(el)s] bf16 lossless"
timeout 60 python3 scripts/gpu_checks.py --dtypes bfloat16 --archs llama,qwen2 --new 16 --json $R/gpu_checks_bf16.json > $R/gpu_checks_bf16.log 2>&1; echo "checks rc=$?" >> $R/status.txt
tar -C $R -cf $OUT/results2.tar .
cat $R/status.txt; grep -A14 "==" $R/bench_*.log | cut -c1-160; tail -2 $R/gpu_checks_bf16.log; echo "[$(el)s] done"
