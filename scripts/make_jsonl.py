#!/usr/bin/env python3
"""Write dflash-pack JSONL from chat conversations, with loss on assistant turns only.

usage: python3 scripts/make_jsonl.py TOKENIZER INPUT OUT [MAX_LEN] [--long truncate|split|drop]
           [--format auto|sharegpt|messages] [--chat-template FILE] [--split train] [--hf-config NAME]
           [--on-bad stop|skip] [--report FILE] [--limit N]

TOKENIZER  a Hugging Face tokenizer directory or hub id (the target's: its chat template renders the turns)
INPUT      a local file (JSONL, one conversation per line, or a JSON array of them) or, when no such file
           exists and `datasets` is installed, a Hugging Face dataset name (--split, --hf-config)
OUT        the packer's JSONL: {"input_ids": [...], "loss_mask": [...]} per line
then:      dflash-pack --data OUT --index OUT.idx   (once; later runs read OUT.idx)

Conversation formats (one per row; --format auto looks at the keys):
  messages       {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": ...}, ...], "tools": [...]}
                 OpenAI style: assistant turns may carry "tool_calls" ([{"type": "function", "function":
                 {"name", "arguments"}}]), tool turns "tool_call_id"/"name"; content may be a list of
                 {"type": "text", "text": ...} parts.
  sharegpt       {"conversations": [{"from": "human"|"gpt"|"system"|"function_call"|"observation"|..., "value": ...}],
                 "tools": ...}: human/user -> user, gpt/assistant/model -> assistant, function_call -> an assistant
                 tool call (value: JSON {"name", "arguments"}), observation/tool/function -> a tool turn.
  A row's "tools" (a list or a JSON string of one) is passed to the chat template.

Loss: on every assistant turn (its content, tool calls and the template's closing tokens, e.g. <|im_end|>),
never on system, user or tool turns, nor on the generation prompt (<|im_start|>assistant). The turn boundaries follow
the speculators preprocessing (dflash-reference.md §1.2): the prompt rendered with the generation prompt must be a
prefix of the conversation rendered through that assistant turn. Templates that re-render earlier turns (Qwen3 drops
earlier turns' reasoning) give one row per assistant turn instead of one per conversation.

Long conversations (more than MAX_LEN tokens, default 8192), --long:
  truncate  (default) cut the row at MAX_LEN; kept when a supervised token remains
  split     cut the conversation at user-turn boundaries into pieces that fit (each re-rendered with the
            template and the conversation's system turn); a single exchange longer than MAX_LEN is truncated
  drop      drop the conversation
Bad rows (not JSON, no known format, unknown role, a tool call that is not JSON, ...) are named by line:
--on-bad stop (default) exits 1 with "INPUT:LINE: reason"; skip prints that line and counts the row as dropped.
At the end a report (stderr; --report FILE also as JSON): rows read, conversations kept whole, truncated, split,
dropped (by reason), rows written, tokens and supervised tokens.

Needs `transformers` (a tool outside the data path; the pipeline itself does not use Python).
"""
import argparse
import json
import os
import sys

SHAREGPT_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "model": "assistant", "chatgpt": "assistant", "bing": "assistant",
    "bard": "assistant",
    "system": "system",
    "observation": "tool", "tool": "tool", "function": "tool", "function_response": "tool", "ipython": "tool",
}
ROLES = ("system", "user", "assistant", "tool")


class BadRow(Exception):
    pass


# ---------------------------------------------------------------- formats

def text_of(content, where):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):   # OpenAI content parts
        out = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                out.append(part["text"])
            else:
                raise BadRow(f"{where}.content[{i}]: only text parts are supported")
        return "".join(out)
    raise BadRow(f"{where}.content: expected a string or a list of text parts")


def parse_arguments(args, where):
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            raise BadRow(f"{where}: arguments is not JSON")
    if isinstance(args, dict):
        return args
    raise BadRow(f"{where}: arguments must be a JSON object or a string of one")


def tool_calls_of(calls, where):
    if not isinstance(calls, list):
        raise BadRow(f"{where}.tool_calls: expected a list")
    out = []
    for i, c in enumerate(calls):
        w = f"{where}.tool_calls[{i}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRow(f"{w}: expected {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}")
        call = {"type": "function", "function": {"name": fn["name"],
                                                 "arguments": parse_arguments(fn.get("arguments", {}), w)}}
        if isinstance(c.get("id"), str):
            call["id"] = c["id"]
        out.append(call)
    return out


def from_messages(msgs):
    if not isinstance(msgs, list):
        raise BadRow("messages: expected a list")
    out = []
    for i, m in enumerate(msgs):
        w = f"messages[{i}]"
        if not isinstance(m, dict) or "role" not in m:
            raise BadRow(f"{w}: expected an object with a role")
        role = m["role"]
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise BadRow(f"{w}.role: unknown role {role!r} (expected one of {', '.join(ROLES)})")
        msg = {"role": role, "content": text_of(m.get("content"), w)}
        if role == "assistant":
            if m.get("tool_calls"):
                msg["tool_calls"] = tool_calls_of(m["tool_calls"], w)
            if isinstance(m.get("reasoning_content"), str):
                msg["reasoning_content"] = m["reasoning_content"]
        if role == "tool":
            for k in ("tool_call_id", "name"):
                if isinstance(m.get(k), str):
                    msg[k] = m[k]
        out.append(msg)
    return out


def from_sharegpt(conv):
    if not isinstance(conv, list):
        raise BadRow("conversations: expected a list")
    out = []
    for i, t in enumerate(conv):
        w = f"conversations[{i}]"
        if not isinstance(t, dict) or "from" not in t or "value" not in t:
            raise BadRow(f"{w}: expected an object with from and value")
        src = str(t["from"]).lower()
        if src == "function_call":   # an assistant tool call (LLaMA-Factory / glaive style)
            try:
                call = json.loads(t["value"]) if isinstance(t["value"], str) else t["value"]
            except json.JSONDecodeError:
                raise BadRow(f"{w}.value: a function_call that is not JSON")
            calls = call if isinstance(call, list) else [call]
            tc = tool_calls_of([{"function": c} for c in calls], w)
            if out and out[-1]["role"] == "assistant" and "tool_calls" not in out[-1]:
                out[-1]["tool_calls"] = tc   # text then call: one assistant turn
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": tc})
            continue
        role = SHAREGPT_ROLES.get(src)
        if role is None:
            raise BadRow(f"{w}.from: unknown speaker {t['from']!r}")
        out.append({"role": role, "content": text_of(t["value"], w)})
    return out


def tools_of(row):
    tools = row.get("tools")
    if tools is None or tools == "" or tools == []:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            raise BadRow("tools: a string that is not JSON")
    if not isinstance(tools, list):
        raise BadRow("tools: expected a list of tool schemas")
    return tools


def conversation(row, fmt):
    """(messages, tools) of one input row."""
    if not isinstance(row, dict):
        raise BadRow("expected a JSON object")
    if fmt == "auto":
        fmt = "messages" if "messages" in row else "sharegpt" if "conversations" in row else None
        if fmt is None:
            raise BadRow("no 'messages' (OpenAI) or 'conversations' (ShareGPT) key")
    key = "messages" if fmt == "messages" else "conversations"
    if key not in row:
        raise BadRow(f"no {key!r} key (--format {fmt})")
    msgs = from_messages(row[key]) if fmt == "messages" else from_sharegpt(row[key])
    return msgs, tools_of(row)


# ---------------------------------------------------------------- rendering

class Renderer:
    def __init__(self, tok, template):
        self.tok, self.template = tok, template

    def __call__(self, messages, tools, gen_prompt):
        kw = {"tokenize": False, "add_generation_prompt": gen_prompt}
        if tools:
            kw["tools"] = tools
        if self.template:
            kw["chat_template"] = self.template
        text = self.tok.apply_chat_template(messages, **kw)
        return self.tok(text, add_special_tokens=False)["input_ids"]


def turn_span(render, messages, tools, j):
    """[start, end) of assistant turn j in render(messages[:j+1]), and that rendering."""
    p, f = render(messages[:j], tools, True), render(messages[:j + 1], tools, False)
    if f[:len(p)] != p:  # the template re-renders earlier text: fall back to the common prefix
        start = next((i for i, (a, b) in enumerate(zip(p, f)) if a != b), min(len(p), len(f)))
        q = render(messages[:j], tools, False)
        if f[:len(q)] != q or len(q) > start:
            return None, f
        p = f[:start]
    return (len(p), len(f)), f


def rows(render, messages, tools):
    """Rows (ids, mask) of one conversation: one with every assistant turn supervised when each turn renders as a
    prefix of the whole; otherwise (templates that drop earlier turns' reasoning) one per assistant turn."""
    turns = [j for j, m in enumerate(messages) if m["role"] == "assistant" and j > 0]
    if not turns:
        return []
    full = render(messages[:turns[-1] + 1], tools, False)
    mask, per_turn = [0] * len(full), []
    for j in turns:
        span, f = turn_span(render, messages, tools, j)
        if span is None:
            continue
        per_turn.append((f, span))
        if mask is not None and full[:len(f)] == f:
            mask[span[0]:span[1]] = [1] * (span[1] - span[0])
        else:
            mask = None
    if mask is not None:
        return [(full, mask)]
    return [(f, [0] * s + [1] * (e - s)) for f, (s, e) in per_turn]


def pieces(messages):
    """Split points for --long split: the conversation's system turns, then exchanges starting at each user turn."""
    system = [m for m in messages if m["role"] == "system"][:1]
    rest = [m for m in messages if m["role"] != "system"]
    starts = [i for i, m in enumerate(rest) if m["role"] == "user"] or [0]
    if starts[0] != 0:
        starts[0] = 0
    bounds = starts + [len(rest)]
    return system, [rest[bounds[i]:bounds[i + 1]] for i in range(len(starts))]


def split_rows(render, messages, tools, max_len):
    """Greedily join exchanges while the rendering fits; a lone exchange that does not fit is truncated.
    Returns (rows, n_truncated)."""
    system, ex = pieces(messages)
    out, trunc, i = [], 0, 0

    def render_of(a, b):
        return rows(render, system + [m for e in ex[a:b] for m in e], tools)

    def fits(rs):
        return all(len(ids) <= max_len for ids, _ in rs)

    while i < len(ex):
        j, rs = i + 1, render_of(i, i + 1)
        while j < len(ex) and fits(rs):
            nxt = render_of(i, j + 1)
            if not fits(nxt):
                break
            j, rs = j + 1, nxt
        for ids, m in rs:   # empty when the exchange has no assistant turn (a trailing user turn)
            if len(ids) > max_len:
                trunc += 1
                ids, m = ids[:max_len], m[:max_len]
            if any(m):
                out.append((ids, m))
        i = j
    return out, trunc


# ---------------------------------------------------------------- input

def read_rows(path, args):
    """Yield (where, row or BadRow) for a local file or a Hugging Face dataset."""
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            head = f.read(4096).lstrip()
            f.seek(0)
            if head.startswith("["):   # a JSON array of conversations (ShareGPT dumps)
                try:
                    data = json.load(f)
                except json.JSONDecodeError as e:
                    yield f"{path}:{e.lineno}", BadRow(f"not JSON ({e.msg}); the whole file is one array")
                    return
                for i, row in enumerate(data):
                    yield f"{path}: element {i}", row
                return
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield f"{path}:{n}", json.loads(line)
                except json.JSONDecodeError as e:
                    yield f"{path}:{n}", BadRow(f"not JSON ({e.msg})")
        return
    try:
        import datasets
    except ImportError:
        sys.exit(f"make_jsonl: {path}: no such file (and `datasets` is not installed to load it as a Hugging Face "
                 "dataset: pip install datasets)")
    ds = datasets.load_dataset(path, args.hf_config, split=args.split)
    for i, row in enumerate(ds):
        yield f"{path}[{args.split}] row {i}", row


# ---------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("tokenizer")
    ap.add_argument("input")
    ap.add_argument("out")
    ap.add_argument("max_len", nargs="?", type=int, default=8192)
    ap.add_argument("--long", choices=("truncate", "split", "drop"), default="truncate")
    ap.add_argument("--format", choices=("auto", "sharegpt", "messages"), default="auto")
    ap.add_argument("--chat-template", help="a Jinja file to use instead of the tokenizer's chat template")
    ap.add_argument("--split", default="train", help="Hugging Face dataset split (default train)")
    ap.add_argument("--hf-config", default=None, help="Hugging Face dataset configuration name")
    ap.add_argument("--on-bad", choices=("stop", "skip"), default="stop")
    ap.add_argument("--report", help="also write the report as JSON here")
    ap.add_argument("--limit", type=int, default=0, help="read at most N rows (0: all)")
    args = ap.parse_args(argv)
    if args.max_len < 2:
        sys.exit("make_jsonl: MAX_LEN must be at least 2")

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    template = None
    if args.chat_template:
        with open(args.chat_template, encoding="utf-8") as f:
            template = f.read()
    elif not getattr(tok, "chat_template", None):
        sys.exit(f"make_jsonl: {args.tokenizer}: the tokenizer has no chat template (give --chat-template FILE)")
    render = Renderer(tok, template)

    rep = {"rows_read": 0, "kept_whole": 0, "truncated": 0, "split": 0, "dropped": 0,
           "dropped_reasons": {}, "rows_written": 0, "tokens": 0, "supervised_tokens": 0}

    def drop(reason):
        rep["dropped"] += 1
        rep["dropped_reasons"][reason] = rep["dropped_reasons"].get(reason, 0) + 1

    tmp = args.out + ".tmp"
    with open(tmp, "w") as fout:
        for where, row in read_rows(args.input, args):
            if args.limit and rep["rows_read"] >= args.limit:
                break
            rep["rows_read"] += 1
            try:
                if isinstance(row, BadRow):
                    raise row
                messages, tools = conversation(row, args.format)
                out = rows(render, messages, tools)
            except BadRow as e:
                line = f"make_jsonl: {where}: {e}"
                if args.on_bad == "stop":
                    os.unlink(tmp)
                    sys.exit(line + " (--on-bad skip skips such rows)")
                print(line, file=sys.stderr)
                drop("bad row")
                continue
            except Exception as e:   # the template itself refused the conversation (e.g. roles out of order)
                line = f"make_jsonl: {where}: the chat template failed: {type(e).__name__}: {e}"
                if args.on_bad == "stop":
                    os.unlink(tmp)
                    sys.exit(line + " (--on-bad skip skips such rows)")
                print(line, file=sys.stderr)
                drop("template error")
                continue
            if not out:
                drop("no assistant turn")
                continue
            if all(len(ids) <= args.max_len for ids, _ in out):
                rep["kept_whole"] += 1
            elif args.long == "drop":
                drop("too long")
                continue
            elif args.long == "split":
                out, n_trunc = split_rows(render, messages, tools, args.max_len)
                rep["split"] += 1
                rep["truncated"] += n_trunc
            else:
                out = [(ids[:args.max_len], m[:args.max_len]) for ids, m in out]
                out = [(ids, m) for ids, m in out if any(m)]
                rep["truncated"] += 1
            if not out:
                drop("nothing supervised within MAX_LEN")
                continue
            for ids, m in out:
                fout.write(json.dumps({"input_ids": ids, "loss_mask": m}, separators=(",", ":")) + "\n")
                rep["rows_written"] += 1
                rep["tokens"] += len(ids)
                rep["supervised_tokens"] += sum(m)
    os.replace(tmp, args.out)
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(rep["dropped_reasons"].items()))
    print(f"make_jsonl: {rep['rows_read']} conversations read: {rep['kept_whole']} kept whole, {rep['truncated']} "
          f"truncated, {rep['split']} split, {rep['dropped']} dropped{' (' + reasons + ')' if reasons else ''}; "
          f"{rep['rows_written']} rows written to {args.out}, {rep['tokens']} tokens, {rep['supervised_tokens']} "
          f"supervised (MAX_LEN {args.max_len}, --long {args.long})", file=sys.stderr)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(rep, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
