#!/usr/bin/env python3
"""Trains kiln's embedded demo model (demo/model): a tiny Qwen3 that writes Go.

The corpus is the Go distribution's own sources (BSD licence), packed by
scripts/pack_go_corpus.sh. The script

  1. trains a byte-level BPE tokenizer with Qwen2/Qwen3's pre-tokenizer and
     Qwen's special tokens appended after the merges, as the hub models have;
  2. builds the training stream: raw Go files separated by <|endoftext|>, plus
     chat examples cut from the same files and rendered as Qwen3's template
     renders an enable_thinking=false answer (empty <think> block), with the
     loss on the answer only;
  3. trains transformers' Qwen3ForCausalLM under bf16 autocast for a fixed
     wall-clock budget, keeping the weights with the best validation loss;
  4. saves a hub-style model directory (config.json, bf16 model.safetensors,
     tokenizer.json, tokenizer_config.json, chat_template.jinja,
     generation_config.json), reloads it from disk and prints greedy samples.

Every stage runs once on an untrained model before the long training, so an
API mistake fails in seconds rather than after the budget is spent.

Only the corpus and chat-example code runs without torch; `--check-corpus`
exercises it on a machine without a GPU.
"""

import argparse
import copy
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import tarfile
import time

# Qwen's added tokens in Qwen's order; True marks the ones the hub tokenizer
# flags "special" (skipped when decoding with skip_special_tokens).
ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
EOT = "<|endoftext|>"
IM_END = "<|im_end|>"

# The pre-tokenizer regex of Qwen2, Qwen2.5 and Qwen3 (single digits).
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# What Qwen3's chat template renders for one user turn answered with
# enable_thinking=false; checked against the real template after saving.
CHAT_PROMPT = "<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"

# Prompts for the greedy samples printed at every evaluation.
RAW_SAMPLES = [
    "package main\n\nimport (\n\t\"fmt\"\n",
    "// Reverse returns s with its runes in reverse order.\nfunc Reverse(s string) string {\n",
    "// Max returns the larger of a and b.\nfunc Max(a, b int) int {\n",
    "func (b *Buffer) Len() int {\n",
]
CHAT_SAMPLES = [
    "write a Go function that reverses a string",
    "Write a Go function that reports whether n is a prime number.",
    "What does this Go function do?\n\n```go\nfunc f(a []int) int {\n\ts := 0\n\tfor _, v := range a {\n\t\ts += v\n\t}\n\treturn s\n}\n```",
]


# ---------------------------------------------------------------- corpus


def read_corpus(path):
    """Returns (licence text, [(name, source)]) from pack_go_corpus.sh's archive."""
    files, licence = [], None
    with tarfile.open(path, "r:xz") as tar:
        for m in tar:
            if not m.isfile():
                continue
            data = tar.extractfile(m).read()
            if m.name == "LICENSE":
                licence = data.decode("utf-8")
                continue
            if not m.name.endswith(".go"):
                continue
            try:
                files.append((m.name, data.decode("utf-8")))
            except UnicodeDecodeError:
                print(f"skip {m.name}: not UTF-8", file=sys.stderr)
    if licence is None:
        raise SystemExit(f"{path}: no LICENSE in the archive")
    if not files:
        raise SystemExit(f"{path}: no .go files in the archive")
    files.sort()
    return licence, files


def is_val(name):
    """Holds out about 2% of the files, chosen by a hash of the name so the
    split does not depend on the order or number of files."""
    return hashlib.sha1(name.encode()).digest()[0] < 6


FUNC_HEAD = re.compile(r"^func (?:\((\w+ )?\*?(\w+)(?:\[[^\]]*\])?\) )?(\w+)")


class GoFunc:
    """A top-level function of a gofmt'd Go file with its doc comment."""

    def __init__(self, doc, head, text, name, recv):
        self.doc = doc  # comment lines, "//" prefixes kept, directives removed
        self.head = head  # signature lines through the opening brace
        self.text = text  # the whole declaration, without the doc comment
        self.name = name
        self.recv = recv  # receiver type name for methods, else None

    def doc_text(self):
        """The first paragraph of the doc comment as one line of prose."""
        words = []
        for line in self.doc:
            body = line[2:].strip()
            if not body:
                if words:
                    break
                continue
            words.append(body)
        return " ".join(words)


def go_functions(src):
    """Yields the top-level functions of a gofmt'd Go source that have a body.

    gofmt puts a top-level declaration's closing brace alone in column 0,
    which is what ends the body here; bodyless declarations (assembly stubs)
    are skipped.
    """
    lines = src.split("\n")
    i = 0
    while i < len(lines):
        m = FUNC_HEAD.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        doc_start = start
        while doc_start > 0 and lines[doc_start - 1].startswith("//"):
            doc_start -= 1
        doc = [l for l in lines[doc_start:start] if not l.startswith("//go:") and not l.startswith("//line ")]
        # The signature may span lines; it ends at the line ending in "{".
        k = start
        while k < len(lines) and not lines[k].endswith("{") and not (k == start and lines[k].endswith("}")):
            if k > start and (not lines[k].strip() or lines[k].startswith("func ") or lines[k].startswith("//")):
                k = -1
                break
            k += 1
        if k < 0 or k >= len(lines):
            i = start + 1
            continue
        if lines[k].endswith("}"):  # one-line function
            end = k
        else:
            end = k + 1
            while end < len(lines) and lines[end] != "}":
                if FUNC_HEAD.match(lines[end]):
                    end = len(lines)
                    break
                end += 1
            if end >= len(lines):
                i = start + 1
                continue
        yield GoFunc(
            doc=doc,
            head="\n".join(lines[start : k + 1]),
            text="\n".join(lines[start : end + 1]),
            name=m.group(3),
            recv=m.group(2),
        )
        i = end + 1


def fence(code):
    return "```go\n" + code + "\n```"


def chat_examples(fn, rng, p_other=0.3):
    """Returns (user, assistant) pairs teaching the chat format on fn: write a
    function from its doc sentence (always, the demo's main use), and with
    probability p_other each, complete one from its signature and explain one
    by its doc comment."""
    doc = "\n".join(fn.doc)
    full = (doc + "\n" if doc else "") + fn.text
    out = []
    prose = fn.doc_text()
    # Go doc comments begin with the name they document: "Reverse returns ...".
    if prose.startswith(fn.name + " ") and len(prose) > len(fn.name) + 8:
        sentence = prose[len(fn.name) + 1 :]
        dot = re.search(r"\.(\s|$)", sentence)
        if dot:
            sentence = sentence[: dot.start() + 1]
        if rng.random() < 0.5:
            sentence = sentence.rstrip(".")
        if fn.recv:
            ask = rng.choice(["Write a Go method on {recv} that {s}", "write a method for the Go type {recv} that {s}"])
        else:
            ask = rng.choice(
                [
                    "Write a Go function that {s}",
                    "write a Go function that {s}",
                    "Write a function in Go that {s}",
                    "Implement a Go function {name} that {s}",
                    "write a go func that {s}",
                ]
            )
        out.append((ask.format(s=sentence, recv=fn.recv, name=fn.name), fence(full)))
    if doc and rng.random() < p_other:
        ask = rng.choice(["Complete this Go function:", "Finish this Go code:", "complete the function"])
        out.append((ask + "\n\n" + fence(doc + "\n" + fn.head), fence(full)))
    if prose and rng.random() < p_other:
        ask = rng.choice(["What does this Go function do?", "Explain this Go code.", "explain"])
        out.append((ask + "\n\n" + fence(fn.text), prose))
    return out


def build_documents(files, chat_share, seed):
    """Splits the corpus into train and validation documents.

    A document is (prompt, answer): raw Go files have an empty prompt and
    the file as answer; chat examples have the rendered user turn as prompt
    and the assistant's answer (which the loss is taken on). Chat examples are
    drawn until their characters reach chat_share of the raw characters.
    """
    rng = random.Random(seed)
    split = {"train": {"raw": [], "chat": []}, "val": {"raw": [], "chat": []}}
    for name, src in files:
        part = split["val" if is_val(name) else "train"]
        part["raw"].append(("", src))
        for fn in go_functions(src):
            if len(fn.text) > 1500 or fn.text.count("\n") < 1:
                continue
            for user, answer in chat_examples(fn, rng):
                part["chat"].append((CHAT_PROMPT.format(user=user), answer + IM_END + "\n"))
    for part in split.values():
        rng.shuffle(part["chat"])
        budget = chat_share * sum(len(a) for _, a in part["raw"])
        kept, size = [], 0
        for ex in part["chat"]:
            if size >= budget:
                break
            kept.append(ex)
            size += len(ex[0]) + len(ex[1])
        part["chat"] = kept
    return split


def check_corpus(args):
    licence, files = read_corpus(args.corpus)
    n = sum(1 for _, src in files for _ in go_functions(src))
    split = build_documents(files, args.chat_share, args.seed)
    for k, part in split.items():
        raw = sum(len(a) for _, a in part["raw"])
        chat = sum(len(p) + len(a) for p, a in part["chat"])
        print(f"{k}: {len(part['raw'])} files {raw} chars, {len(part['chat'])} chat examples {chat} chars")
    print(f"{n} functions; licence {licence.splitlines()[0]!r}")
    rng = random.Random(1)
    for p, a in rng.sample(split["train"]["chat"], 4):
        print("=" * 60 + "\n" + p + a)


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(texts, vocab_size):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED_TOKENS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    # Appended one by one so the ids follow Qwen's order after the merges.
    for content, special in ADDED_TOKENS:
        t = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        (tok.add_special_tokens if special else tok.add_tokens)([t])
    if tok.get_vocab_size() != vocab_size:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, want {vocab_size}")
    return tok


def hf_tokenizer(tok, chat_template, max_len):
    """Wraps a copy of tok (the wrapper sets truncation on the object it
    holds, which must not leak into corpus encoding) as a transformers fast
    tokenizer that saves the hub files."""
    from tokenizers import Tokenizer

    try:
        from transformers import TokenizersBackend as Fast
    except ImportError:
        from transformers import PreTrainedTokenizerFast as Fast
    t = Fast(
        tokenizer_object=Tokenizer.from_str(tok.to_str()),
        eos_token=IM_END,
        pad_token=EOT,
        model_max_length=max_len,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    t.chat_template = chat_template
    return t


# ---------------------------------------------------------------- model


def encode_stream(tok, docs, eot_id):
    """Concatenates docs into one token stream with a per-token loss mask
    (0 on chat prompts), each document followed by <|endoftext|>."""
    import numpy as np

    prompts = tok.encode_batch([p for p, _ in docs], add_special_tokens=False)
    answers = tok.encode_batch([a for _, a in docs], add_special_tokens=False)
    ids, mask = [], []
    for p, a in zip(prompts, answers):
        ids += p.ids + a.ids + [eot_id]
        mask += [0] * len(p.ids) + [1] * (len(a.ids) + 1)
    return np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.uint8)


def mix(raw, chat, seed):
    docs = raw + chat
    random.Random(seed).shuffle(docs)
    return docs


class Batches:
    """Random windows of seq_len+1 tokens from a token stream on the GPU."""

    def __init__(self, ids, mask, seq_len, device):
        import torch

        self.ids = torch.from_numpy(ids).to(device)
        self.mask = torch.from_numpy(mask).to(device)
        self.seq_len = seq_len
        self.offsets = torch.arange(seq_len + 1, device=device)

    def sample(self, batch, gen):
        import torch

        starts = torch.randint(0, len(self.ids) - self.seq_len - 1, (batch, 1), device=self.ids.device, generator=gen)
        idx = starts + self.offsets
        w = self.ids[idx]
        return w[:, :-1], w[:, 1:], self.mask[idx][:, 1:]


def masked_loss(model, x, y, m):
    import torch
    import torch.nn.functional as F

    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=x, use_cache=False).logits
    nll = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
    w = m.flatten().float()
    return (nll * w).sum() / w.sum().clamp(min=1)


def evaluate(model, sets, batch, n_batches):
    """Mean masked loss over fixed windows of each validation set."""
    import torch

    model.eval()
    out = {}
    with torch.no_grad():
        for name, (data, gen_seed) in sets.items():
            gen = torch.Generator(device=data.ids.device)
            gen.manual_seed(gen_seed)
            losses = [masked_loss(model, *data.sample(batch, gen)).item() for _ in range(n_batches)]
            out[name] = sum(losses) / len(losses)
    model.train()
    return out


def generate(model, ids, max_new, stop_ids, temperature=0.0, top_k=0, top_p=1.0, seed=0):
    """Greedy (temperature 0) or sampled continuation of ids, recomputing the
    whole prefix each step: the model is small and this keeps the sampler
    independent of transformers' generation API."""
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    out = list(ids)
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(max_new):
            ctx = torch.tensor([out[-model.config.max_position_embeddings :]], device="cuda")
            logits = model(input_ids=ctx, use_cache=False).logits[0, -1].float()
            if temperature <= 0:
                nxt = int(logits.argmax())
            else:
                logits = logits / temperature
                if top_k > 0:
                    kth = torch.topk(logits, top_k).values[-1]
                    logits[logits < kth] = -float("inf")
                probs = torch.softmax(logits, -1)
                sp, si = torch.sort(probs, descending=True)
                cut = torch.cumsum(sp, 0) - sp > top_p
                sp[cut] = 0
                nxt = int(si[torch.multinomial(sp / sp.sum(), 1, generator=gen)])
            out.append(nxt)
            if nxt in stop_ids:
                break
    model.train()
    return out[len(ids) :]


def print_samples(model, tok, stop_ids, max_new, sampling=None):
    def show(prompt, ids, **kw):
        new = generate(model, ids, max_new, stop_ids, **kw)
        print("--- prompt: " + json.dumps(prompt))
        print(tok.decode(new, skip_special_tokens=False))

    for p in RAW_SAMPLES:
        show(p, tok.encode(p, add_special_tokens=False))
    for q in CHAT_SAMPLES:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, enable_thinking=False, tokenize=False
        )
        show(q, tok.encode(ids, add_special_tokens=False))
        if sampling:
            print("(sampled with the generation config's defaults)")
            show(q, tok.encode(ids, add_special_tokens=False), **sampling)
    sys.stdout.flush()


KEEP = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
]


def save(model, tok, gen_config, scratch, out):
    """Writes the model directory to out (the files in KEEP, nothing else)."""
    import torch

    shutil.rmtree(scratch, ignore_errors=True)
    m = copy.deepcopy(model).to(torch.bfloat16)
    m.save_pretrained(scratch, safe_serialization=True)
    tok.save_pretrained(scratch)
    gen_config.save_pretrained(scratch)
    template = os.path.join(scratch, "chat_template.jinja")
    if not os.path.exists(template):  # older transformers embed it in tokenizer_config.json
        with open(template, "w") as f:
            f.write(tok.chat_template)
    os.makedirs(out, exist_ok=True)
    for f in KEEP:
        if not os.path.exists(os.path.join(scratch, f)):
            raise SystemExit(f"save: transformers wrote no {f} (wrote {sorted(os.listdir(scratch))})")
        shutil.copy(os.path.join(scratch, f), os.path.join(out, f))
    print(f"saved {out}: " + ", ".join(f"{f} {os.path.getsize(os.path.join(out, f))}" for f in KEEP))


def reload_and_check(out, tok_in_memory):
    """Loads the saved directory as a user would and checks the tokenizer and
    chat template agree with what training used."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).cuda()
    probe = "func main() {\n\tfmt.Println(\"héllo, 世界\")\n}\n" + EOT
    a, b = tok.encode(probe, add_special_tokens=False), tok_in_memory.encode(probe, add_special_tokens=False).ids
    if a != b or tok.decode(a) != probe:
        raise SystemExit(f"reloaded tokenizer disagrees: {a} vs {b}")
    user = CHAT_SAMPLES[0]
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": user}], add_generation_prompt=True, enable_thinking=False, tokenize=False
    )
    if rendered != CHAT_PROMPT.format(user=user):
        raise SystemExit(f"chat template renders {rendered!r}, training used {CHAT_PROMPT.format(user=user)!r}")
    full = tok.apply_chat_template(
        [{"role": "user", "content": user}, {"role": "assistant", "content": "X"}], tokenize=False
    )
    if full != CHAT_PROMPT.format(user=user) + "X" + IM_END + "\n":
        raise SystemExit(f"chat template renders a finished turn as {full!r}")
    return model, tok


def train(args):
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    t_start = time.time()
    deadline = args.deadline or (t_start + 1e9)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; budget {args.train_seconds}s")

    licence, files = read_corpus(args.corpus)
    split = build_documents(files, args.chat_share, args.seed)
    with open(args.chat_template) as f:
        template = f.read()

    t = time.time()
    tok = train_tokenizer([a for _, a in split["train"]["raw"]], args.vocab)
    print(f"tokenizer: {tok.get_vocab_size()} tokens in {time.time() - t:.1f}s")
    eot_id, im_end_id = tok.token_to_id(EOT), tok.token_to_id(IM_END)
    hf_tok = hf_tokenizer(tok, template, args.seq_len)

    t = time.time()
    streams = {}
    for k, part in split.items():
        streams[k] = encode_stream(tok, mix(part["raw"], part["chat"], args.seed), eot_id)
        streams[k + "_raw"] = encode_stream(tok, part["raw"], eot_id)
        streams[k + "_chat"] = encode_stream(tok, part["chat"], eot_id)
    n_raw_bytes = sum(len(a.encode()) for _, a in split["train"]["raw"])
    n_raw_tok = len(streams["train_raw"][0])
    print(
        f"encoded in {time.time() - t:.1f}s: train {len(streams['train'][0])} tokens "
        f"({n_raw_tok} raw Go, {len(streams['train_chat'][0])} chat, {n_raw_bytes / n_raw_tok:.2f} bytes/token), "
        f"val {len(streams['val'][0])} tokens, {len(split['train']['chat'])} chat examples"
    )

    dev = "cuda"
    train_data = Batches(*streams["train"], args.seq_len, dev)
    val_sets = {
        "val_raw": (Batches(*streams["val_raw"], args.seq_len, dev), 1),
        "val_chat": (Batches(*streams["val_chat"], args.seq_len, dev), 2),
    }

    config = Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.seq_len,
        max_window_layers=args.layers,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta},
        bos_token_id=eot_id,
        eos_token_id=im_end_id,
        pad_token_id=eot_id,
    )
    model = Qwen3ForCausalLM(config).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters ({n_params * 2 / 1e6:.1f} MB in bf16); config {config.to_json_string()}")
    gen_config = GenerationConfig(
        bos_token_id=eot_id,
        pad_token_id=eot_id,
        eos_token_id=[im_end_id, eot_id],
        do_sample=True,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        # A 6M-parameter model falls into loops ("ReverseReverse...") at
        # these temperatures; 1.2 was chosen by trying 1.1 and 1.2 with kiln run.
        repetition_penalty=1.2,
    )
    sampling = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "seed": args.seed}
    stop_ids = {im_end_id, eot_id}

    # Dry run of everything after training, on the untrained weights.
    save(model, hf_tok, gen_config, args.scratch, args.out)
    reloaded, rtok = reload_and_check(args.out, tok)
    print_samples(reloaded, rtok, stop_ids, 8)
    del reloaded
    print(f"preflight done at {time.time() - t_start:.0f}s")

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        fused=True,
    )
    step_model = model
    if args.compile:
        try:
            step_model = torch.compile(model)
            g = torch.Generator(device=dev)
            g.manual_seed(0)
            masked_loss(step_model, *train_data.sample(args.batch, g)).backward()
            opt.zero_grad(set_to_none=True)
            print(f"torch.compile ready at {time.time() - t_start:.0f}s")
        except Exception as e:  # eager is slower but trains the same model
            print(f"torch.compile failed, training eagerly: {e!r}")
            step_model = model
            opt.zero_grad(set_to_none=True)

    # The budget counts from here; it shrinks if the deadline leaves less,
    # keeping room to save, reload and sample.
    t0 = time.time()
    budget = min(args.train_seconds, deadline - t0 - args.reserve_seconds)
    print(f"training for {budget:.0f}s, {args.batch}x{args.seq_len} tokens a step")
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    best, best_state, step, tokens = float("inf"), None, 0, 0
    next_eval = t0 + args.eval_every
    last_log = t0
    while True:
        elapsed = time.time() - t0
        done = elapsed >= budget
        if done or time.time() >= next_eval:
            # Eager: a compiled graph would recompile for no_grad/eval mode.
            v = evaluate(model, val_sets, args.batch, args.eval_batches)
            score = v["val_raw"] + v["val_chat"]
            mark = ""
            if score < best:
                best, mark = score, " *"
                best_state = {k: t.detach().clone() for k, t in model.state_dict().items()}
            print(
                f"eval step {step} t={elapsed:.0f}s tokens={tokens / 1e6:.1f}M "
                f"val_raw {v['val_raw']:.4f} val_chat {v['val_chat']:.4f}{mark}"
            )
            sys.stdout.flush()
            next_eval = time.time() + args.eval_every
            if done:
                break
        frac = min(elapsed / budget, 1.0)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = masked_loss(step_model, *train_data.sample(args.batch, gen))
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens += args.batch * args.seq_len
        if time.time() - last_log >= 10 or step == 1:
            now = time.time()
            print(
                f"step {step} t={now - t0:.0f}s lr {lr:.2e} loss {loss.item():.4f} gnorm {gnorm.item():.2f} "
                f"{tokens / (now - t0) / 1e3:.0f}k tok/s"
            )
            sys.stdout.flush()
            last_log = now
    train_time = time.time() - t0
    model.load_state_dict(best_state)
    print(f"trained {step} steps, {tokens / 1e6:.1f}M tokens in {train_time:.0f}s; kept the best eval (sum {best:.4f})")

    save(model, hf_tok, gen_config, args.scratch, args.out)
    reloaded, rtok = reload_and_check(args.out, tok)
    v = evaluate(reloaded, val_sets, args.batch, args.eval_batches)
    print(f"final (reloaded bf16): val_raw {v['val_raw']:.4f} val_chat {v['val_chat']:.4f}")
    print_samples(reloaded, rtok, stop_ids, args.sample_tokens, sampling)
    print(f"licence of the training data: {licence.splitlines()[0]}")
    print(f"total {time.time() - t_start:.0f}s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True, help="go-src.tar.xz from scripts/pack_go_corpus.sh")
    ap.add_argument("--chat-template", help="Qwen3's chat template (Jinja)")
    ap.add_argument("--out", help="model directory to write")
    ap.add_argument("--scratch", default="/tmp/kiln-demo-save", help="where transformers saves before the copy")
    ap.add_argument("--check-corpus", action="store_true", help="only build and print the corpus (no torch needed)")
    ap.add_argument("--chat-share", type=float, default=0.45, help="most chat example characters per raw character")
    ap.add_argument("--vocab", type=int, default=6144)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=704)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rope-theta", type=float, default=1e6)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--train-seconds", type=float, default=300)
    ap.add_argument("--deadline", type=float, default=0, help="unix time by which everything must be written")
    ap.add_argument("--reserve-seconds", type=float, default=45, help="kept before the deadline for saving")
    ap.add_argument("--eval-every", type=float, default=45, help="seconds between validation runs")
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--sample-tokens", type=int, default=160)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.check_corpus:
        check_corpus(args)
        return
    if not args.out or not args.chat_template:
        ap.error("--out and --chat-template are required for training")
    train(args)


if __name__ == "__main__":
    main()
