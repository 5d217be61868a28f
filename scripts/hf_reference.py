#!/usr/bin/env python3
"""The transformers baseline for the GPU suite (scripts/gpu-suite.sh).

Builds a Qwen3-8B with random weights (transformers' init, std 0.02, fixed
seed) in bf16 on the GPU, saves it as bf16 safetensors with its config.json
to --out, computes the last-position logits of a fixed prompt (written as
ref_logits.f32 with hf_reference.json holding the prompt), and times HF eager
decode at batch 1 and prefill at 512 / 4096 tokens on the same GPU.

Usage: python3 scripts/hf_reference.py --out /tmp/qwen3-8b-synth [--layers N]
"""
import argparse
import json
import os
import statistics
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def timed(fn, reps):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decode-context", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=32)
    args = ap.parse_args()

    cfg = Qwen3Config(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=args.layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False, initializer_range=0.02, eos_token_id=151645,
    )
    torch.manual_seed(args.seed)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg)
    model.eval()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)

    g = torch.Generator().manual_seed(1234)
    prompt = torch.randint(0, cfg.vocab_size, (1, 48), generator=g)
    with torch.no_grad():
        logits = model(prompt.cuda(), logits_to_keep=1).logits[0, -1].float().cpu()
    logits.numpy().astype("<f4").tofile(os.path.join(args.out, "ref_logits.f32"))
    ref = {"prompt": prompt[0].tolist(), "seed": args.seed, "layers": args.layers,
           "transformers": __import__("transformers").__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name()}

    timing = {}
    with torch.no_grad():
        for P in (512, 4096):
            ids = torch.randint(0, cfg.vocab_size, (1, P), generator=g).cuda()
            model(ids, logits_to_keep=1)  # warm-up
            t = timed(lambda: model(ids, logits_to_keep=1), 3)
            timing[f"prefill_{P}_tok_s"] = P / t
        ids = torch.randint(0, cfg.vocab_size, (1, args.decode_context), generator=g).cuda()
        out = model(ids, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        for _ in range(3):  # warm-up steps
            out = model(tok, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)

        def decode():
            nonlocal tok, out
            for _ in range(args.decode_steps):
                out = model(tok, past_key_values=out.past_key_values, use_cache=True)
                tok = out.logits[:, -1:].argmax(-1)

        t = timed(decode, 1)
        timing[f"decode_b1_ctx{args.decode_context}_tok_s"] = args.decode_steps / t
    ref["timing"] = timing
    # The same model in float32 (weights upcast): how far bf16 arithmetic
    # itself moves the logits, for judging kiln (float32 activations).
    model.float()
    with torch.no_grad():
        l32 = model(prompt.cuda(), logits_to_keep=1).logits[0, -1].float().cpu()
    l32.numpy().astype("<f4").tofile(os.path.join(args.out, "ref_logits_fp32.f32"))
    ref["bf16_vs_fp32_rel_l2"] = float((logits - l32).norm() / l32.norm())
    with open(os.path.join(args.out, "hf_reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(json.dumps(timing), "bf16 vs fp32 logits rel L2", ref["bf16_vs_fp32_rel_l2"])


if __name__ == "__main__":
    main()
