#!/usr/bin/env bash
# What the H200 run of 2026-12-04 left unchecked, and what changed since, in about 4 minutes:
# the float32 lossless check with the corrected HF reference (expected: every output identical;
# that run had 224/256, the reference's fault), `mtplayer train --kind mtp` on CUDA after the
# cache-argument fix, the tree start-up probe in bfloat16/float16 on CUDA for every architecture
# of the lossless suite, and the zoo's MTP module drafting on CUDA.
#   carry: .whl (wheels of the repo's packages, for their entry points, and stevedore):
#     rm -rf .whl && pip wheel --no-deps -w .whl ./lightspec_core ./kernels ./plugins/lightspec-* && pip download --no-deps -d .whl stevedore==5.10.0
# Results: $OUT/results5.tar (JSON and logs); the summary is printed.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:?}
R=$(mktemp -d /tmp/lsres.XXXX); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import torch,transformers,sys;print(sys.version.split()[0],torch.__version__,transformers.__version__)"; } > $R/env.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/pip.log 2>&1 || { cat $R/pip.log; exit 1; }
SRC=$PWD/lightspec_core/src:$PWD/kernels/src:$PWD/zoo/src
for p in plugins/*/src; do SRC=$SRC:$PWD/$p; done
export PYTHONPATH=$SRC:/tmp/site
( timeout 120 python3 scripts/gpu_train_checks.py --device cuda --only mtp --json $R/train_mtp.json > $R/train.log 2>&1
  echo "train mtp rc=$?" >> $R/status.txt ) &
TRAIN=$!
timeout 90 python3 scripts/gpu_tree_probe_checks.py --device cuda --json $R/tree_probe.json > $R/tree_probe.log 2>&1
echo "tree probe rc=$?" >> $R/status.txt
wait $TRAIN
tar -C $R -cf $OUT/results5.tar .
echo "[$(el)s] lossless float32"
timeout 150 python3 scripts/gpu_plugin_checks.py --dtypes float32 --no-sampled --json $R/lossless_fp32.json > $R/lossless.log 2>&1
echo "lossless fp32 rc=$?" >> $R/status.txt
tar -C $R -cf $OUT/results5.tar .
cat $R/env.txt $R/status.txt; tail -3 $R/tree_probe.log; tail -12 $R/train.log | cut -c1-300; tail -25 $R/lossless.log | cut -c1-200
echo "[$(el)s] done"
