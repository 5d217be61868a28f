#!/usr/bin/env python3
"""Make the tokenizer conformance data under testdata/tokenizer/.

Runs on the GPU machine (it has HF `tokenizers`). It builds a varied corpus
(Python source, license prose, generated multilingual text, emoji, CRLF,
tabs, long repeats, NFC-sensitive text), trains a byte-level BPE with the
Qwen pre-tokenizer and Qwen3's added tokens, writes the tokenizer in four
tokenizer.json variants and, for each, the ids and decodes HF produces for
a large set of fixed and random strings and random id sequences.

Usage: make_tokenizer_cases.py OUTDIR [--bench]
  --bench  also time HF encode over the corpus lines, single-threaded.
"""
import gzip
import json
import os
import random
import sys
import sysconfig
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import (  # noqa: E402
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_DIGITS3_PATTERN = QWEN2_PATTERN.replace(r"|\p{N}|", r"|\p{N}{1,3}|")

# Qwen3's added tokens, in id order after the model vocabulary, with its flags.
QWEN3_ADDED = [(c, True) for c in [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
    "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>"]] + [(c, False) for c in [
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>"]]

# Extra added tokens exercising the flags Qwen3 leaves off.
EXTRA_ADDED = [
    dict(content="<|mask|>", lstrip=True, rstrip=True, single_word=False, normalized=False, special=False),
    dict(content="<|pad|>", lstrip=True, rstrip=False, single_word=False, normalized=False, special=True),
    dict(content="nai\u0308ve", lstrip=False, rstrip=False, single_word=True, normalized=True, special=False),
    dict(content="<|im", lstrip=False, rstrip=False, single_word=False, normalized=False, special=False),
    dict(content="\u00e7a", lstrip=False, rstrip=False, single_word=False, normalized=False, special=False),
]

PROSE = [
    "The quick brown fox jumps over the lazy dog. It's 9:41 a.m., isn't it?",
    "We'll see; they've said they'd come, but I'm not sure you're right.",
    "DON'T SHOUT! I'LL BE THERE. You'VE BEEN WARNED, he'D said.",
    "人工智能正在改变世界。我们需要更好的工具来理解语言模型的行为。",
    "今日は良い天気ですね。東京タワーに行きましょう！カタカナとひらがな。",
    "안녕하세요. 오늘 날씨가 정말 좋네요. 한국어 문장을 토큰화합니다.",
    "Привет, мир! Это тестовое предложение на русском языке, 2024 год.",
    "مرحبا بالعالم. هذه جملة اختبار باللغة العربية مع أرقام ١٢٣٤٥.",
    "नमस्ते दुनिया। यह हिंदी में एक परीक्षण वाक्य है।",
    "Γειά σου κόσμε! Αυτή είναι μια δοκιμή με ελληνικά γράμματα.",
    "Fußgängerübergänge in München, Köln und Zürich sind schön.",
    "Die Geſchichte iſt ſchön, ſo iſt es; das Feſt iſt ſtill. Es iſt's, ſagt' ſie.",
    "Ça coûte 12,50 € — déjà vu, naïve café, garçon, œuvre.",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ ซึ่งทำให้การตัดคำยาก",
    "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ ố ồ ổ ỗ ộ.",
    "Emoji: 👩‍👩‍👧‍👦 👨🏽‍💻 🏳️‍🌈 🇯🇵🇺🇸 ❤️‍🔥 🧑‍🤝‍🧑 ✌🏿 1️⃣ #️⃣",
    "Decomposed: e\u0301 a\u0300 o\u0302 A\u030a n\u0303 \u1100\u1161\u11a8 \u0915\u093c",
    "Numbers 1234567890 3.14159 -42 1e-9 0x1F ①②③ ½ ² Ⅻ ３４５ ٣٤٥ ๑๒๓",
    "Spaces:\u00a0nbsp\u3000ideographic\u2002en\u2009thin\u202fnarrow\u205fmath\u0085nel\u2028ls",
]

CODE = [
    "def f(x):\n\treturn x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\r\n    sum += a[i];\r\n}\r\n",
    "    if err != nil {\n        return fmt.Errorf(\"load %s: %w\", path, err)\n    }\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%ann%';\n",
    "<div class=\"box\"><span>Hello&nbsp;world</span></div>\n",
    "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); }\n",
    "x = {'a': [1, 2, 3], \"b\": None, 'c': {'d': 4.5e-3}}\n",
    "#include <stdio.h>\n\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n}\n",
]


def corpus_text():
    """About 700 KB of varied text, the same on every run."""
    rng = random.Random(1234)
    parts = []
    stdlib = sysconfig.get_paths()["stdlib"]
    names = sorted(n for n in os.listdir(stdlib) if n.endswith(".py"))
    code = []
    size = 0
    for n in names:
        with open(os.path.join(stdlib, n), encoding="utf-8", errors="replace") as f:
            s = f.read()
        code.append(s)
        size += len(s)
        if size > 300_000:
            break
    parts.extend(code)
    for lic in ["Apache-2.0", "GPL-3", "LGPL-3", "MPL-2.0", "GFDL-1.3", "Artistic"]:
        p = os.path.join("/usr/share/common-licenses", lic)
        if os.path.exists(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
    gen = []
    for _ in range(3000):
        k = rng.random()
        if k < 0.45:
            s = " ".join(rng.choice(PROSE) for _ in range(rng.randint(1, 3)))
        elif k < 0.7:
            s = rng.choice(CODE)
        elif k < 0.78:
            s = rng.choice(["=", "-", "ab", "哈", " ", "\t", "😀", "\n"]) * rng.randint(8, 200)
        elif k < 0.86:
            s = " ".join(str(rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(rng.randint(1, 8)))
        elif k < 0.93:
            s = "\r\n".join(rng.choice(PROSE) for _ in range(3))
        else:
            s = "".join(rng.choice(["  ", "\t", "\n", " \n", "\r\n", "\n\n\n", "x", "'s", "'LL"]) for _ in range(rng.randint(3, 30)))
        gen.append(s + rng.choice(["\n", "\n", "\n\n", "\r\n", " \n"]))
    parts.append("".join(gen))
    return "".join(parts)


# Character ranges for random strings: blocks assigned long ago, so that the
# Unicode versions of HF's engines and Go's agree on every property.
RANGES = [
    (0x20, 0x7E, 30), (0x09, 0x0D, 6), (0xA0, 0xFF, 4), (0x100, 0x17F, 3),
    (0x300, 0x36F, 4), (0x370, 0x3FF, 2), (0x400, 0x4FF, 2), (0x590, 0x5FF, 1),
    (0x600, 0x6FF, 2), (0x900, 0x97F, 2), (0xE00, 0xE7F, 1), (0x1100, 0x11FF, 2),
    (0x1E00, 0x1EFF, 2), (0x2000, 0x206F, 3), (0x2070, 0x209F, 1), (0x20A0, 0x20BF, 1),
    (0x2150, 0x218B, 1), (0x2460, 0x24FF, 1), (0x3000, 0x303F, 2), (0x3040, 0x30FF, 3),
    (0x4E00, 0x9FA5, 6), (0xAC00, 0xD7A3, 3), (0xFE00, 0xFE0F, 1), (0xFF00, 0xFFEF, 2),
    (0x1F300, 0x1F64F, 4), (0x1F680, 0x1F6C5, 1), (0x1F3FB, 0x1F3FF, 1), (0x200D, 0x200D, 2),
    (0x0085, 0x0085, 1), (0x2028, 0x2029, 1), (0x17F, 0x17F, 1),
]
PIECES = ["'s", "'S", "'ll", "'LL", "'ve", "'re", "'d", "'m", "'t", "'\u017f", " ", "  ", "\n", "\r\n",
          "\t", " \n ", "\n\n", "123", "e\u0301", "A\u030a", "\u1100\u1161", "<|im", "<|im_start|>",
          "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|mask|>", " <|mask|> ", "<|pad|>",
          "naïve", "nai\u0308ve", "ça", "<|endoftext|>", "<tool_", "<|", "|>", "\u00a0", "\u3000"]


def random_string(rng, words):
    out = []
    for _ in range(rng.randint(1, 24)):
        k = rng.random()
        if k < 0.5:
            lo, hi, _ = rng.choices(RANGES, weights=[w for _, _, w in RANGES])[0]
            out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))))
        elif k < 0.75:
            out.append(rng.choice(PIECES))
        else:
            out.append(rng.choice(words))
    return "".join(out)


FIXED = [
    "", " ", "  ", "   ", "\n", "\r\n", "\t", "\n\n", " \n", "\n ", " \n \n ", "a", "a ", " a", "a  b",
    "a \n b", "a\t\tb", "hello world", "Hello, World!", "it's", "IT'S", "they'll've", "'s", "''s", "x'",
    "'\u017f", "don'\u017f", "'ll'", "a'LL", "1", "12", "123", "1234", "12345678901234567890",
    "3.14", "1,000,000", "v1.2.3", "\u0661\u0662\u0663", "\u00bd\u00b2\u2167", "１２３",
    "e\u0301", "\u00e9", "A\u030a", "\u212b", "\u1100\u1161\u11a8", "\uac01", "\u0301", "\u0301a",
    "a\u0301\u0301\u0327", "\u0915\u093c", "\u0958",
    "<|im_start|>", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<think>\n\n</think>\n\n", "<think>\nreason</think>answer", "<|im_start", "<|im", "<|im_",
    "<|im<|im_end|>", "<<|im_end|>>", "<|endoftext|><|endoftext|>", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "<tool_response>ok</tool_response>", "x <|mask|> y", "x<|mask|>y", "  <|mask|>  ", "<|mask|><|mask|>",
    " \t<|mask|>\n\n", "a <|pad|> b", "  <|pad|>", "naïve", "nai\u0308ve", "a naïve b", "xnaïve",
    "naïvex", "naïve!", "ça", "\u00e7a", "c\u0327a", "garçon", "<|im_end|>\u0301", "a<|im_end|>\u0301b",
    "\u00a0", "a\u00a0b", "\u3000", "\u3000\u3000x", "\u0085", "a\u2028b", " \u2003 x",
    "\U0001F469\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466", "\U0001F1FA\U0001F1F8",
    "\U0001F44B\U0001F3FD", "1\ufe0f\u20e3", "\u2764\ufe0f", "😀😀😀", "a😀b",
    "    def f():\n        pass\n", "\tx\n\t\ty", "a\r\nb\r\n\r\n", "\r", "\r\r\n\n", " \r\n",
    "x  \n  y", "x   ", "   x", "!!!", " !!!", "!!!\n\n", "...\r\n", " ?\n", "--", " -- ",
    "=" * 100, "a" * 300, "ab" * 200, "\u54c8" * 100, " " * 50, "\n" * 20, "😀" * 40,
    "Hello世界", "世界hello", "ÅngströmÅ", "\u017fs", "ǅungla", "ß ẞ", "İstanbul", "ﬁ ﬂ",
    "'\u017ft", "iſt'\u017ftill", "x'\u017fst", "'St", "<|mask|> <|mask|>", "<|mask|>  <|pad|>  x",
    "a\t<|pad|><|mask|>\u3000b", "naïve naïve", "naïve_x", "\u0301naïve", "\x00", "\x01\x02", "\x7f", "a\x00b", "\ufeff", "\ufffd", "\U0010fffd", "\ue000",
]


def ids_str(ids):
    return [int(i) for i in ids]


def make_cases(tok, strings, rng, n_decode):
    vocab_n = tok.get_vocab_size(with_added_tokens=True)
    enc = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False).ids
        enc.append({"text": s, "ids": ids_str(ids), "decoded": tok.decode(ids, skip_special_tokens=False)})
    dec = []
    for i in range(n_decode):
        n = rng.randint(1, 12)
        ids = [rng.randrange(vocab_n) for _ in range(n)]
        if i % 10 == 0:
            ids.insert(rng.randrange(len(ids) + 1), vocab_n + rng.randrange(5))
        try:
            text = tok.decode(ids, skip_special_tokens=False)
        except Exception:
            continue
        dec.append({"ids": ids, "text": text})
        # The decoded text, itself encoded: random byte-level tokens.
        ids2 = tok.encode(text, add_special_tokens=False).ids
        enc.append({"text": text, "ids": ids_str(ids2), "decoded": tok.decode(ids2, skip_special_tokens=False)})
    return {"encode": enc, "decode": dec}


def variant(base, merges_form, ignore_merges, normalizer, pre_tokenizer):
    j = json.loads(json.dumps(base))
    pairs = [m.split(" ") if isinstance(m, str) else m for m in j["model"]["merges"]]
    if merges_form == "string":
        assert all(" " not in a and " " not in b for a, b in pairs)
        j["model"]["merges"] = [a + " " + b for a, b in pairs]
    else:
        j["model"]["merges"] = pairs
    j["model"]["ignore_merges"] = ignore_merges
    j["normalizer"] = normalizer
    j["pre_tokenizer"] = pre_tokenizer
    return j


def split_bytelevel(pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}


def bench(tok_json, lines, label, log):
    tok = Tokenizer.from_str(tok_json)
    total = sum(len(l.encode("utf-8")) for l in lines)
    t0 = time.perf_counter()
    for l in lines:
        tok.encode(l, add_special_tokens=False)
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(3):
        t0 = time.perf_counter()
        for l in lines:
            tok.encode(l, add_special_tokens=False)
        warm.append(time.perf_counter() - t0)
    w = min(warm)
    msg = (f"HF {label}: {len(lines)} lines {total} bytes; cold {cold:.3f}s {total / cold / 1e6:.2f} MB/s; "
           f"warm {w:.3f}s {total / w / 1e6:.2f} MB/s")
    print(msg)
    log.append(msg)


def main():
    out = sys.argv[1]
    do_bench = "--bench" in sys.argv
    os.makedirs(out, exist_ok=True)
    text = corpus_text()
    lines = text.splitlines(keepends=True)
    with gzip.open(os.path.join(out, "corpus.txt.gz"), "wt", encoding="utf-8", newline="") as f:
        f.write(text)

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=trainer)
    base = json.loads(tok.to_str())
    nvocab = len(base["model"]["vocab"])
    added = [dict(content=c, single_word=False, lstrip=False, rstrip=False, normalized=False, special=s)
             for c, s in QWEN3_ADDED] + EXTRA_ADDED
    base["added_tokens"] = [dict(id=nvocab + i, **a) for i, a in enumerate(added)]
    base["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    base["post_processor"] = None

    nfc = {"type": "NFC"}
    variants = {
        # Qwen3 as published: "a b" merges, NFC, the Qwen2 split pattern.
        "qwen3": variant(base, "string", False, nfc, split_bytelevel(QWEN2_PATTERN)),
        # Qwen3.5's pattern, ["a","b"] merges, ignore_merges, no normalizer.
        "qwen35": variant(base, "pairs", True, None, split_bytelevel(QWEN35_PATTERN)),
        # Digits in threes, normalizer in a Sequence.
        "digits3": variant(base, "pairs", False, {"type": "Sequence", "normalizers": [nfc]},
                           split_bytelevel(QWEN2_DIGITS3_PATTERN)),
        # Plain ByteLevel with its own GPT-2 regex and a prefix space.
        "gpt2": variant(base, "string", False, None,
                        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}),
    }

    rng = random.Random(99)
    words = [w for w in text.split() if len(w) < 20][:20000]
    strings = list(FIXED)
    strings += [l for l in lines[::40]][:1200]
    strings += [random_string(rng, words) for _ in range(1500)]
    log = []
    for name, j in variants.items():
        s = json.dumps(j, ensure_ascii=False, indent=1)
        t = Tokenizer.from_str(s)  # HF must accept the file as written
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(s)
        cases = make_cases(t, strings, random.Random(7), 600)
        with gzip.open(os.path.join(d, "cases.json.gz"), "wt", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False, separators=(",", ":"))
        print(name, "vocab", t.get_vocab_size(with_added_tokens=True), "encode cases", len(cases["encode"]),
              "decode cases", len(cases["decode"]))
        if do_bench and name == "qwen3":
            # Lines as Go's strings.SplitAfter(text, "\n") cuts them.
            parts = text.split("\n")
            bench(s, [p + "\n" for p in parts[:-1]] + [parts[-1]], name, log)
    if log:
        with open(os.path.join(out, "bench_hf.txt"), "w") as f:
            f.write("\n".join(log) + "\n")


if __name__ == "__main__":
    main()
