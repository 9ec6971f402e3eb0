#!/usr/bin/env bash
# Re-distil the shipped draft on the target's own output (on-policy), on this CPU (2 threads, ~1 hour):
#   1. make_onpolicy_data.py: the target continues random training windows (zoo/build/tokens-onpolicy);
#   2. the draft: --init-from the shipped draft, distilled from the shipped target on that data, DRAFT_S seconds;
#   3. eval_draft_acceptance.py: old and new draft on the suite's prompts (greedy chain acceptance);
#   4. the new draft installed into src/lightspec_zoo/models/draft, its card keeping the earlier stages.
# The target is not changed. Resumable: run it again after an interruption.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DATA_S=${DATA_S:-1500}
DRAFT_S=${DRAFT_S:-2400}
THREADS=${THREADS:-2}
MODELS=zoo/src/lightspec_zoo/models
BUILD=zoo/build/models
[ -f zoo/build/tokens-copy/train.bin ] || { echo "zoo/build/tokens-copy missing: run cpu_finetune_copy.sh's make_copy_data.py step first"; exit 2; }
mkdir -p "$BUILD"
[ -d "$BUILD/draft-before-onpolicy" ] || cp -r "$MODELS/draft" "$BUILD/draft-before-onpolicy"
"$PY" zoo/scripts/make_onpolicy_data.py --target "$MODELS/target" --source zoo/build/tokens-copy \
  --out zoo/build/tokens-onpolicy --tokens 3000000 --batch-size 64 --time-budget-s "$DATA_S" --threads "$THREADS"
"$PY" zoo/scripts/train.py --init-from "$BUILD/draft-before-onpolicy" --distill-from "$MODELS/target" \
  --data zoo/build/tokens-onpolicy --out "$BUILD/draft-onpolicy" --name draft --ctx 256 --batch-size 16 \
  --lr 5e-4 --warmup 20 --kd-alpha 0.1 --time-budget-s "$DRAFT_S" --eval-every 100 --eval-tokens 16384 \
  --final-eval-tokens 65536 --threads "$THREADS" --ckpt-every 100 --seed 1234 --no-progress --resume
"$PY" zoo/scripts/eval_draft_acceptance.py --target "$MODELS/target" --draft "$BUILD/draft-before-onpolicy" \
  --draft "$BUILD/draft-onpolicy" --limit 8 --threads "$THREADS" --json "$BUILD/draft-onpolicy/acceptance.json"
rm -rf "$MODELS/draft" && cp -r "$BUILD/draft-onpolicy" "$MODELS/draft"
mv "$MODELS/draft/acceptance.json" "$MODELS/draft/acceptance_eval.json"
"$PY" - "$BUILD/draft-before-onpolicy/README.md" "$MODELS/draft/README.md" "$MODELS/draft/acceptance_eval.json" <<'PYEOF'
import json, re, sys
old, new = (open(p).read() for p in sys.argv[1:3])
new = new.replace("fine-tuned from `draft-before-onpolicy` (its weights",
                  "fine-tuned from `draft` as shipped before this run (the copy fine-tuned draft below; its weights", 1)
# the earlier card's stages, from its "## Training" up to "## Use", become this card's history
earlier = re.search(r"\n## Training\n(.*?)\n## Use", old, re.S).group(1).strip()
earlier = re.sub(r"^## ", "### ", earlier, flags=re.M).replace("### Held-out evaluation\n",
                                                              "Held-out evaluation after copy fine-tuning:\n", 1)
new = new.replace("## Held-out evaluation", "## Earlier stages (the starting point)\n\n### Copy fine-tuning\n\n"
                  + earlier + "\n\n## Held-out evaluation", 1)
acc = json.load(open(sys.argv[3]))
before, now = acc["results"].values()
rows = ["| workload | top-1 before | top-1 now | accepted before | accepted now |", "|---|---:|---:|---:|---:|"]
rows += [f"| {w} | {before[w]['top1']:.3f} | {now[w]['top1']:.3f} | {before[w]['accepted']:.2f} | {now[w]['accepted']:.2f} |"
         for w in before]
a = acc["args"]
new = new.replace("## Use\n", "## Acceptance on the target's own output\n\n"
    "What a draft is for: predicting what the target writes. `zoo/scripts/eval_draft_acceptance.py` lets the target "
    f"write {a['new_tokens']} tokens greedily after each of the first {a['limit']} prompts of every benchmark workload "
    f"(held-out files), then at every position drafts a greedy chain of k = {a['k']} from the same context "
    f"(the last {a['draft_context']} tokens) and counts the tokens accepted before the first miss. "
    "Before: the copy fine-tuned draft this run started from. Numbers in `acceptance_eval.json`.\n\n"
    + "\n".join(rows) + "\n\n## Use\n", 1)
open(sys.argv[2], "w").write(new)
PYEOF
du -sh "$MODELS"/*
echo "installed the on-policy draft into $MODELS/draft"
