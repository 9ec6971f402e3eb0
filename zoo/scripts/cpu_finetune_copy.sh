#!/usr/bin/env bash
# Fine-tune the shipped zoo models to copy when asked, on this CPU (2 threads, ~70 minutes):
#   1. make_copy_data.py: the copy-task mixture (zoo/build/tokens-copy);
#   2. the target: --init-from the shipped target, next-token CE, TARGET_S seconds;
#   3. the draft: --init-from the shipped draft, distilled from the new target, DRAFT_S seconds;
#   4. both installed into src/lightspec_zoo/models/, each model card keeping the
#      pre-training section of the model it started from.
# Resumable: run it again after an interruption (train.py --resume).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
TARGET_S=${TARGET_S:-2700}
DRAFT_S=${DRAFT_S:-1200}
THREADS=${THREADS:-2}
MODELS=zoo/src/lightspec_zoo/models
BUILD=zoo/build/models
[ -f zoo/build/tokens/train.bin ] || { echo "zoo/build/tokens missing: run prepare_data.py, train_tokenizer.py, tokenize_corpus.py first"; exit 2; }
[ -f zoo/build/tokens-copy/train.bin ] || "$PY" zoo/scripts/make_copy_data.py --out zoo/build/tokens-copy
mkdir -p "$BUILD"
rm -rf "$BUILD/pretrained" && cp -r "$MODELS" "$BUILD/pretrained"
"$PY" zoo/scripts/train.py --init-from "$BUILD/pretrained/target" --data zoo/build/tokens-copy \
  --out "$BUILD/target-copy" --name target --ctx 1024 --batch-size 4 --lr 3e-4 --warmup 20 \
  --time-budget-s "$TARGET_S" --eval-every 150 --eval-tokens 32768 --final-eval-tokens 0 \
  --threads "$THREADS" --ckpt-every 100 --seed 1234 --no-progress --resume
"$PY" zoo/scripts/train.py --init-from "$BUILD/pretrained/draft" --distill-from "$BUILD/target-copy" \
  --data zoo/build/tokens-copy --out "$BUILD/draft-copy" --name draft --ctx 1024 --batch-size 4 --lr 5e-4 \
  --warmup 20 --time-budget-s "$DRAFT_S" --eval-every 200 --eval-tokens 16384 --final-eval-tokens 0 \
  --threads "$THREADS" --ckpt-every 200 --seed 1234 --no-progress --resume
for m in target draft; do
  rm -rf "$MODELS/$m" && cp -r "$BUILD/$m-copy" "$MODELS/$m"
  "$PY" - "$BUILD/pretrained/$m/README.md" "$MODELS/$m/README.md" <<'EOF'
import re, sys
old, new = (open(p).read() for p in sys.argv[1:])
pre = re.search(r"## Training\n(.*?)\n## ", old, re.S).group(1).strip()
pre_eval = re.search(r"## Held-out evaluation\n(.*?)\n## ", old, re.S).group(1).strip()
new = new.replace("## Held-out evaluation", "## Pre-training (the starting point)\n\n" + pre
                  + "\n\nHeld-out evaluation after pre-training:\n\n" + pre_eval + "\n\n## Held-out evaluation", 1)
open(sys.argv[2], "w").write(new)
EOF
done
du -sh "$MODELS"/*
echo "installed into $MODELS"
