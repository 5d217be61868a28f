#!/usr/bin/env python3
"""Which bf16 roundings move a model's logits, found with hooks on
transformers' own modules (any architecture; rounding_study.py re-writes a
dense Qwen3's forward instead).

Loads a directory of scripts/hf_reference.py in float32 (the weights as
stored, bf16; torch's TF32 defaults, as there), then runs its prompts again rounding to bf16 only
where a variant says, and prints each variant's last-position logits'
relative L2 distance from transformers fp32 (ref_logits_fp32.f32). A
variant rounds the inputs of a set of products (nn.Linear, and the fused
experts' modules, whose first argument is their input rows) or the output
of a set of modules:

  products      every product's input: what a bf16 tensor-core GEMM or a
                bf16 GEMV with bf16 activations reads (kiln's CUDA path)
  deltanet      the Gated DeltaNet layers' products only
  but_out       every product's but the DeltaNet's out projection
  attention     the attention layers' products only
  moe           the MoE blocks' products only (router, experts, shared)
  lm_head       the LM head's input only
  gates         the output of in_proj_ba (beta's and the decay's inputs)
  conv          the causal conv's output
  norm          the gated RMSNorm's output (the out projection's input)

Usage (on the GPU machine):
  python3 scripts/rounding_hooks.py --model /tmp/qn4
"""
import argparse
import json
import os

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def is_product(mod):
    return isinstance(mod, torch.nn.Linear) or type(mod).__name__.endswith("Experts")


VARIANTS = {
    "none": ("in", lambda n, m: False),
    "products": ("in", lambda n, m: is_product(m)),
    "deltanet": ("in", lambda n, m: is_product(m) and ".linear_attn." in n),
    "but_out": ("in", lambda n, m: is_product(m) and not n.endswith("linear_attn.out_proj")),
    "attention": ("in", lambda n, m: is_product(m) and ".self_attn." in n),
    "moe": ("in", lambda n, m: is_product(m) and ".mlp." in n),
    "lm_head": ("in", lambda n, m: n == "lm_head"),
    "gates": ("out", lambda n, m: n.endswith("linear_attn.in_proj_ba")),
    "conv": ("out", lambda n, m: n.endswith("linear_attn.conv1d")),
    "norm": ("out", lambda n, m: n.endswith("linear_attn.norm")),
}


def bf(x):
    return x.bfloat16().float() if torch.is_tensor(x) and x.is_floating_point() else x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    ref = json.load(open(os.path.join(args.model, "hf_reference.json")))
    prompts = ref["prompts"]
    w32 = torch.from_numpy(np.fromfile(os.path.join(args.model, "ref_logits_fp32.f32"), dtype="<f4")).view(len(prompts), -1)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).cuda().eval()
    names = dict(model.named_modules())
    for v in args.variants.split(","):
        where, pick = VARIANTS[v]
        hooks = []
        for n, m in names.items():
            if not pick(n, m):
                continue
            if where == "in":
                hooks.append(m.register_forward_pre_hook(lambda m, a: (bf(a[0]),) + tuple(a[1:])))
            else:
                hooks.append(m.register_forward_hook(lambda m, a, out: bf(out)))
        with torch.no_grad():
            got = [model(torch.tensor([p]).cuda(), logits_to_keep=1).logits[0, -1].float().cpu() for p in prompts]
        for h in hooks:
            h.remove()
        d = [float((g - w).norm() / w.norm()) for g, w in zip(got, w32)]
        print(f"{v:10s} {len(hooks):4d} modules  " + "  ".join(f"{len(p)} tokens {e:.4g}" for p, e in zip(prompts, d)), flush=True)


if __name__ == "__main__":
    main()
