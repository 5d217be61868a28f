#!/usr/bin/env python3
"""Writes testdata/chat/cases.json: what transformers' apply_chat_template renders
for the Qwen templates in testdata/chat/ over a suite of conversations.

Run where transformers is installed (the GPU machine; no download needed):

    python3 scripts/make_chat_cases.py [--out testdata/chat/cases.json]

Every message is written in the exact shape kiln's chat.Message marshals to
(content always present, empty optional fields omitted), so that the Go test
hands the template the same data transformers saw. A case that makes the
template fail records the exception's type and message instead of a rendering.
"""

import argparse
import json
import os
import sys

import jinja2
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "testdata", "chat")
TEMPLATES = ["qwen3.jinja", "qwen3.8.jinja"]

# The special tokens the tiny tokenizer carries; they reach the template as
# variables exactly as a real Qwen tokenizer_config.json would pass them.
SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


def tiny_tokenizer():
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "a": 3}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="a"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL)


def msg(role, content="", reasoning_content=None, tool_calls=None, tool_call_id=None, name=None):
    """A message in chat.Message's JSON shape and key order."""
    m = {"role": role, "content": content}
    if reasoning_content:
        m["reasoning_content"] = reasoning_content
    if tool_calls:
        m["tool_calls"] = tool_calls
    if tool_call_id:
        m["tool_call_id"] = tool_call_id
    if name:
        m["name"] = name
    return m


def call(name, arguments, id=None):
    """An assistant tool call; arguments is a dict (an object) or a str (JSON text)."""
    c = {}
    if id:
        c["id"] = id
    c["type"] = "function"
    c["function"] = {"name": name, "arguments": arguments}
    return c


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city. Quotes \"like this\", <b>tags</b> & ampersands; unicode: 東京, ünïcödé, emoji 🌦.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\"\nsecond line\ttab"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city"],
        },
    },
}

CALC = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate numbers.",
        "parameters": {
            "type": "object",
            "properties": {
                "x": {"type": "number", "minimum": -1.5, "maximum": 1e20, "multipleOf": 0.001},
                "precise": {"type": "boolean", "default": False},
                "tags": {"type": "array", "items": {"type": "string"}},
                "options": {"type": "object", "properties": {"mode": {"type": ["string", "null"]}}},
                "scale": {"type": "number", "default": 100.0, "exclusiveMinimum": 1e-7},
                "note": {"type": "string", "default": None},
            },
            "required": ["x"],
        },
    },
}

TOOLS = [WEATHER, CALC]

SYS = msg("system", "You are a careful assistant.")
USER = msg("user", "What's the weather in Paris?")
ARGS_DICT = {"city": "Paris", "unit": "celsius", "days": 3}
ARGS_RICH = {"x": 2.5, "precise": True, "tags": ["a", "b"], "options": {"mode": None, "z": 1}, "note": "multi\nline ✓"}
ARGS_STR = '{"city": "Tokyo", "days": 2}'


def conversations():
    """(name, messages, tools, kwargs) for every conversation; each is rendered
    with and without the generation prompt."""
    yield "single_user", [USER], None, {}
    yield "system_user", [SYS, USER], None, {}
    yield "empty_system", [msg("system", ""), USER], None, {}
    yield "multi_turn", [SYS, USER, msg("assistant", "It is sunny."), msg("user", "And tomorrow?")], None, {}
    yield "reasoning_content", [
        USER,
        msg("assistant", "Sunny.", reasoning_content="The user asks about weather.\nI know it."),
        msg("user", "Thanks! Anything else?"),
        msg("assistant", "No.", reasoning_content="  Nothing to add.  "),
    ], None, {}
    yield "think_in_content", [
        USER,
        msg("assistant", "<think>\nLet me think.\n</think>\n\nIt is sunny."),
        msg("user", "Sure?"),
        msg("assistant", "<think>Hmm.</think>Yes."),
    ], None, {}
    yield "final_assistant", [USER, msg("assistant", "Partial answer", reasoning_content="thinking")], None, {}
    yield "tools_user", [USER], TOOLS, {}
    yield "tools_system_user", [SYS, USER], TOOLS, {}
    yield "tool_call_dict_args", [
        SYS, USER,
        msg("assistant", "", tool_calls=[call("get_weather", ARGS_DICT, id="call_1")]),
        msg("tool", '{"temp": 21, "sky": "clear"}', tool_call_id="call_1"),
    ], TOOLS, {}
    yield "tool_call_string_args", [
        USER,
        msg("assistant", "", tool_calls=[call("get_weather", ARGS_STR, id="call_2")]),
        msg("tool", "22 degrees", tool_call_id="call_2"),
    ], TOOLS, {}
    yield "tool_call_rich_args", [
        msg("user", "Compute it."),
        msg("assistant", "I'll compute.", reasoning_content="Use the calculator.",
            tool_calls=[call("calculate", ARGS_RICH)]),
        msg("tool", "2.5"),
        msg("assistant", "The result is 2.5."),
    ], TOOLS, {}
    yield "parallel_tool_calls", [
        SYS,
        msg("user", "Weather in Paris and Tokyo, then compute."),
        msg("assistant", "Checking both.", tool_calls=[
            call("get_weather", {"city": "Paris"}, id="a"),
            call("get_weather", {"city": "Tokyo", "unit": "fahrenheit"}, id="b"),
        ]),
        msg("tool", "Paris: 21C", tool_call_id="a"),
        msg("tool", "Tokyo: 70F", tool_call_id="b"),
        msg("assistant", "", reasoning_content="Now compute.", tool_calls=[call("calculate", {"x": 1})]),
        msg("tool", "1"),
        msg("assistant", "Paris 21C, Tokyo 70F, result 1."),
        msg("user", "Thanks."),
    ], TOOLS, {}
    yield "tool_response_user", [
        msg("user", "Start."),
        msg("assistant", "", tool_calls=[call("calculate", {"x": 3})]),
        msg("user", "<tool_response>\n3\n</tool_response>"),
    ], TOOLS, {}
    yield "tool_first", [msg("tool", "orphan result"), USER], None, {}
    yield "unicode", [
        msg("system", "Réponds en français. 日本語も。"),
        msg("user", "Ça va? 🙂 \u2028 tabs\tand \"quotes\" and \\backslash"),
    ], None, {}
    yield "enable_thinking_false", [SYS, USER], None, {"enable_thinking": False}
    yield "enable_thinking_true", [USER], None, {"enable_thinking": True}
    yield "enable_thinking_false_tools", [USER], TOOLS, {"enable_thinking": False}
    yield "reasoning_effort_low", [SYS, USER], None, {"reasoning_effort": "low"}
    yield "reasoning_effort_medium", [USER], TOOLS, {"reasoning_effort": "medium"}
    yield "reasoning_effort_low_tools", [SYS, USER], TOOLS, {"reasoning_effort": "low"}
    yield "reasoning_effort_bad", [USER], None, {"reasoning_effort": "max"}
    yield "preserve_thinking_false", [
        USER,
        msg("assistant", "Sunny.", reasoning_content="Old reasoning."),
        msg("user", "And now?"),
    ], None, {"preserve_thinking": False}
    yield "extra_kwarg", [USER], None, {"custom_flag": "unused", "enable_thinking": True}
    yield "no_user", [SYS], None, {}
    yield "only_assistant", [msg("assistant", "Hello.")], None, {}
    yield "no_messages", [], None, {}
    yield "system_not_first", [USER, msg("system", "Late system."), msg("user", "Hi")], None, {}
    yield "unknown_role", [USER, msg("critic", "Bad.")], None, {}
    yield "tools_empty_list", [USER], [], {}
    yield "think_in_user", [msg("user", "<think>not mine</think> Explain </think> tags.")], None, {}
    yield "reasoning_and_think_content", [
        USER,
        msg("assistant", "\n\nIt has </think> inside.", reasoning_content="\nReal reasoning.\n"),
        msg("user", "Odd."),
    ], None, {}
    yield "named_tool_result", [
        USER,
        msg("assistant", "", tool_calls=[call("get_weather", {"city": "Oslo"}, id="c9")]),
        msg("tool", "cold", tool_call_id="c9", name="get_weather"),
    ], TOOLS, {"enable_thinking": False}
    yield "whitespace_content", [msg("system", "  padded system  \n"), msg("user", "\n  padded user \n")], None, {}


def render(tok, template, messages, tools, add_generation_prompt, kwargs):
    try:
        out = tok.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            return_dict=False,
            chat_template=template,
            **kwargs,
        )
        if not isinstance(out, str):
            raise SystemExit(f"apply_chat_template returned {type(out).__name__}, not str")
        return {"rendered": out}
    except Exception as e:  # the template's own errors are part of the expectation
        return {"error": str(e), "error_type": type(e).__name__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(DATA, "cases.json"))
    args = ap.parse_args()

    tok = tiny_tokenizer()
    cases = []
    for tname in TEMPLATES:
        with open(os.path.join(DATA, tname), encoding="utf-8") as f:
            template = f.read()
        for name, messages, tools, kwargs in conversations():
            for agp in (True, False):
                c = {
                    "name": f"{tname}/{name}/gen={int(agp)}",
                    "template": tname,
                    "messages": messages,
                    "tools": tools,
                    "add_generation_prompt": agp,
                    "kwargs": kwargs,
                }
                c.update(render(tok, template, messages, tools, agp, kwargs))
                cases.append(c)
    doc = {
        "generator": "scripts/make_chat_cases.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "special_tokens": SPECIAL,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errs = sum(1 for c in cases if "error" in c)
    print(f"wrote {len(cases)} cases ({errs} template errors) to {args.out} with transformers {transformers.__version__}")
    for c in cases:
        if "error" in c:
            print(f"  {c['name']}: {c['error_type']}: {c['error']}")


if __name__ == "__main__":
    sys.exit(main())
