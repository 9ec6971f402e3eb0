#!/usr/bin/env bash
# CPU-only build of the zoo (one core): data -> tokenizer -> tokens -> target -> distilled draft,
# installed into zoo/src/lightspec_zoo/models/.  Budgets via env: TARGET_S (default 840), DRAFT_S (300).
# Run in the background:  nohup bash zoo/scripts/cpu_train_all.sh > zoo/build/cpu_train.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
TARGET_S=${TARGET_S:-840}
DRAFT_S=${DRAFT_S:-300}
B=zoo/build
if [ ! -f $B/tokens/train.bin ]; then
  $PY zoo/scripts/prepare_data.py
  $PY zoo/scripts/train_tokenizer.py --out $B/tokenizer
  $PY zoo/scripts/tokenize_corpus.py --tokenizer $B/tokenizer --out $B/tokens
fi
COMMON="--data $B/tokens --tokenizer $B/tokenizer --device cpu --threads 1 --ctx 256 --batch-size 8 \
  --eval-every 200 --eval-tokens 32768 --final-eval-tokens 0 --ckpt-every 200 --resume --no-progress"
$PY zoo/scripts/train.py $COMMON --preset target-cpu --name target --lr 2e-3 --warmup 50 \
  --time-budget-s $TARGET_S --out $B/models/target --log-json $B/models/target_log.json
$PY zoo/scripts/train.py $COMMON --preset draft-cpu --name draft --lr 3e-3 --warmup 50 \
  --distill-from $B/models/target --time-budget-s $DRAFT_S --out $B/models/draft --log-json $B/models/draft_log.json
mkdir -p zoo/src/lightspec_zoo/models
for m in target draft; do
  rm -rf zoo/src/lightspec_zoo/models/$m
  cp -r $B/models/$m zoo/src/lightspec_zoo/models/$m
done
echo "CPU zoo build done"
