"""Mean accepted length of an EAGLE-3 head on the zoo target: the first 4 suite prompts of each
workload, 64 new tokens, batch 1, greedy, a static chain of k drafts (no timing involved).

Usage: python plugins/lightspec-eagle3/scripts/zoo_acceptance.py HEAD_FOLDER K OUT.json
"""
import json
import sys

import lightspec_zoo
import torch
from lightspec_eagle3.drafter import Eagle3Drafter

from lightspec_core import MTPPipeline

torch.set_num_threads(1)
head, k, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tok, target = lightspec_zoo.load()
res = {}
tot_s = tot_e = 0
for budget in ({"type": "static", "k": k},):
    pipe = MTPPipeline(target, tok, strategy=Eagle3Drafter(head=head, max_draft=k), budget=budget)
    for w, prompts in lightspec_zoo.prompt_sets().items():
        steps = emitted = 0
        for p in prompts[:4]:
            o = pipe.generate(p, max_new_tokens=64, ignore_eos=True)
            steps += o.stats.steps
            emitted += o.stats.new_tokens
        res[w] = round(emitted / steps, 3)
        tot_s, tot_e = tot_s + steps, tot_e + emitted
        print(w, res[w], flush=True)
res["all"] = round(tot_e / tot_s, 3)
print(res)
json.dump({"head": head, "k": k, "tokens_per_step": res}, open(out, "w"), indent=1)
