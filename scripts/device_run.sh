#!/usr/bin/env bash
# The one prepared GPU session (H200): kernel benchmark, GPU lossless checks + lightspec bench
# (fp32 and bf16), and the zoo training (target + distilled draft), inside ~570 s.
# Results: $OUT/results.tar (logs and JSON) + the zoo's tar parts and checksum.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:?}
R=$(mktemp -d /tmp/lsres.XXXX)
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; } > $R/env.txt 2>&1
python3 -m pip install -q --no-deps --no-index .gpu_carry/*.whl > $R/pip.log 2>&1
export PYTHONPATH=$PWD/lightspec_core/src:$PWD/kernels/src:$PWD/zoo/src
echo "[$(el)s] kernels bench"
timeout 170 python3 kernels/bench.py --json $R/kernels.json > $R/kernels.log 2>&1; echo "kernels rc=$?" >> $R/status.txt
echo "[$(el)s] zoo training (background)"
left=$(( 560 - $(el) ))
TS=$(( (left - 75) * 62 / 100 )); DS=$(( (left - 75) * 38 / 100 ))
echo "target ${TS}s draft ${DS}s" >> $R/status.txt
mkdir -p $R/zoo
( TARGET_S=$TS DRAFT_S=$DS OUT=$R/zoo bash zoo/scripts/gpu_train_all.sh > $R/train.log 2>&1; echo "train rc=$?" >> $R/status.txt ) &
TRAIN=$!
echo "[$(el)s] lossless checks"
timeout 220 python3 scripts/gpu_checks.py --json $R/gpu_checks.json > $R/gpu_checks.log 2>&1; echo "checks rc=$?" >> $R/status.txt
echo "[$(el)s] lightspec bench"
for dt in float32 bfloat16; do
  timeout 90 python3 -m lightspec_core.cli bench --device cuda --dtype $dt --prompts zoo/src/lightspec_zoo/prompts/edit.jsonl --limit 4 \
    --max-new-tokens 64 --json $R/bench_$dt.json > $R/bench_$dt.log 2>&1; echo "bench $dt rc=$?" >> $R/status.txt
done
echo "[$(el)s] waiting for training"
wait $TRAIN
echo "[$(el)s] packing"
mv $R/zoo/zoo_models.tar.part-* $R/zoo/zoo_models.sha256 $OUT/ 2>/dev/null
tar -C $R -cf $OUT/results.tar .
cat $R/status.txt; tail -5 $R/gpu_checks.log; tail -15 $R/kernels.log; tail -3 $R/train.log
echo "[$(el)s] done"
