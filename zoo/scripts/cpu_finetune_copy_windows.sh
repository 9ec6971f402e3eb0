#!/usr/bin/env bash
# Copy stage 2 for the shipped target, on this CPU (2 threads, ~50 minutes). An experiment, not
# what the shipped weights came from: the result copies better but made the suite slower overall,
# with the shipped draft and with one re-distilled for it (zoo/README.md, "A copy stage with
# window documents"); INSTALL=1 installs it anyway.
#   1. make_copy_data.py with window documents: copy documents are 75% of the mixture,
#      half of them random code windows, not only whole functions (zoo/build/tokens-copy-v2);
#   2. the target: --init-from the installed target, next-token CE, lr 2e-4, TARGET_S seconds;
#   3. eval_copy.py: how well the installed and the new target copy (held-out functions that
#      are not suite prompts), written to the new model's copy_eval.jsonl;
#   4. with INSTALL=1, the new target installed into src/lightspec_zoo/models/target, its card
#      keeping the earlier stages.  The draft is not changed here (see cpu_distill_onpolicy.sh).
# Resumable: run it again after an interruption (train.py --resume).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
TARGET_S=${TARGET_S:-2700}
THREADS=${THREADS:-2}
INSTALL=${INSTALL:-0}
MODELS=zoo/src/lightspec_zoo/models
BUILD=zoo/build/models
DATA=zoo/build/tokens-copy-v2
[ -f zoo/build/tokens/train.bin ] || { echo "zoo/build/tokens missing: run prepare_data.py, train_tokenizer.py, tokenize_corpus.py first"; exit 2; }
[ -f "$DATA/train.bin" ] || "$PY" zoo/scripts/make_copy_data.py --out "$DATA" --windows 9000 --copy-fraction 0.75 --seed 4321
mkdir -p "$BUILD"
[ -d "$BUILD/target-before-copy2" ] || cp -r "$MODELS/target" "$BUILD/target-before-copy2"
"$PY" zoo/scripts/train.py --init-from "$BUILD/target-before-copy2" --data "$DATA" \
  --out "$BUILD/target-copy3" --name target --ctx 1024 --batch-size 4 --lr 2e-4 --warmup 20 \
  --time-budget-s "$TARGET_S" --eval-every 150 --eval-tokens 32768 --final-eval-tokens 0 \
  --threads "$THREADS" --ckpt-every 100 --seed 777 --no-progress --resume
"$PY" zoo/scripts/eval_copy.py --model "$BUILD/target-before-copy2" --model "$BUILD/target-copy3" --json \
  > "$BUILD/target-copy3/copy_eval.jsonl"
cat "$BUILD/target-copy3/copy_eval.jsonl"
[ "$INSTALL" = 1 ] || { echo "not installed (INSTALL=1 installs it): $BUILD/target-copy3"; exit 0; }
rm -rf "$MODELS/target" && cp -r "$BUILD/target-copy3" "$MODELS/target"
"$PY" - "$BUILD/target-before-copy2/README.md" "$MODELS/target/README.md" "$MODELS/target/copy_eval.jsonl" <<'PYEOF'
import json, re, sys
old, new = (open(p).read() for p in sys.argv[1:3])
new = re.sub(r"fine-tuned from `[^`]+` \(its weights were the starting point;",
             "fine-tuned from `target` as shipped before this run (the copy fine-tuned target below; its weights "
             "were the starting point;", new, count=1)
# the earlier card's stages ("## Training" up to its last evaluation) become this card's history
earlier = re.search(r"\n## Training\n(.*?)\n## Use", old, re.S).group(1).strip()
earlier = re.sub(r"^## ", "### ", earlier, flags=re.M)
new = new.replace("## Held-out evaluation", "## Earlier stages (the starting point)\n\n### Copy fine-tuning, stage 1\n\n"
                  + earlier + "\n\n## Held-out evaluation", 1)
before, now = (json.loads(line) for line in open(sys.argv[3]))
rows = ["| model | teacher-forced top-1 | greedy copy run (tokens) | exact copies |", "|---|---:|---:|---:|"]
rows += [f"| {name} | {r['teacher_forced_top1']:.3f} | {r['greedy_copy_run']:.1f} | {r['greedy_exact']:.0%} |"
         for name, r in (("before this stage", before), ("this model", now))]
new = new.replace("## Use\n", "## Copying (what the suite's `edit` workload needs)\n\n"
    f"`zoo/scripts/eval_copy.py`: {now['examples']} functions of the held-out files that are not suite prompts, in the "
    "suite's edit format (\"the same function with `x` renamed to `new_x`\"); over the first 128 tokens of each ideal "
    "answer, the model's top-1 accuracy given the ideal prefix, and how many tokens of its greedy continuation "
    "(64 tokens) agree with the ideal answer before the first difference. Numbers in `copy_eval.jsonl`.\n\n"
    + "\n".join(rows) + "\n\n## Use\n", 1)
open(sys.argv[2], "w").write(new)
PYEOF
du -sh "$MODELS"/*
echo "installed the stage-2 copy target into $MODELS/target"
