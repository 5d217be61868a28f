#!/usr/bin/env python3
"""The transformers baseline for the GPU suite (scripts/gpu-suite.sh).

Builds a Qwen3-8B (or, with --arch qwen3next, Qwen3-Next-80B-A3B's shape)
with random weights (transformers' init, std 0.02, fixed seed) in bf16 on the
GPU, saves it as bf16 safetensors with its config.json to --out, and computes
the last-position logits of fixed random prompts (--prompts: their lengths)
in bf16 and in float32 (the same weights upcast): ref_logits.f32 and
ref_logits_fp32.f32, [prompts, vocab], with hf_reference.json holding the
prompts. For Qwen3-8B it also times HF eager decode at batch 1 and prefill at
512 / 4096 tokens on the same GPU. TestHFReference (backend/cuda) compares
kiln with them.

Usage: python3 scripts/hf_reference.py --out /tmp/qwen3-8b-synth [--layers N]
       python3 scripts/hf_reference.py --arch qwen3next --layers 4 --prompts 48,300,1500 --out DIR
"""
import argparse
import json
import os
import statistics
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM


def timed(fn, reps):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def config(arch, layers):
    if arch == "qwen3":
        return Qwen3Config(
            vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
            max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False, initializer_range=0.02, eos_token_id=151645,
        ), Qwen3ForCausalLM
    # Qwen3-Next-80B-A3B's published config (model/synthetic.go's), its
    # layers three Gated DeltaNet to one gated attention.
    return Qwen3NextConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=5120, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, num_experts=512, num_experts_per_tok=10, norm_topk_prob=True,
        decoder_sparse_step=1, num_hidden_layers=layers,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6, max_position_embeddings=262144,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False, initializer_range=0.02, eos_token_id=151645,
    ), Qwen3NextForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", choices=["qwen3", "qwen3next"], default="qwen3")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--prompts", default="48", help="the prompts' lengths, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decode-context", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=32)
    args = ap.parse_args()

    cfg, cls = config(args.arch, args.layers)
    torch.manual_seed(args.seed)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = cls(cfg)
    model.eval()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)

    g = torch.Generator().manual_seed(1234)
    prompts = [torch.randint(0, cfg.vocab_size, (1, int(n)), generator=g) for n in args.prompts.split(",")]

    def last_logits():
        with torch.no_grad():
            return torch.stack([model(p.cuda(), logits_to_keep=1).logits[0, -1].float().cpu() for p in prompts])

    logits = last_logits()
    logits.numpy().astype("<f4").tofile(os.path.join(args.out, "ref_logits.f32"))
    ref = {"prompts": [p[0].tolist() for p in prompts], "arch": args.arch, "seed": args.seed, "layers": args.layers,
           "transformers": __import__("transformers").__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name()}

    if args.arch == "qwen3":
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
    l32 = last_logits()
    l32.numpy().astype("<f4").tofile(os.path.join(args.out, "ref_logits_fp32.f32"))
    ref["bf16_vs_fp32_rel_l2"] = [float((a - b).norm() / b.norm()) for a, b in zip(logits, l32)]
    with open(os.path.join(args.out, "hf_reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(json.dumps(ref.get("timing", {})), "bf16 vs fp32 logits rel L2", ref["bf16_vs_fp32_rel_l2"])


if __name__ == "__main__":
    main()
