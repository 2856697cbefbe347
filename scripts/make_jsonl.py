#!/usr/bin/env python3
"""Write dflash-pack JSONL from chat conversations, with loss on assistant turns only.

usage: python3 scripts/make_jsonl.py MODEL_OR_TOKENIZER_DIR conversations.jsonl out.jsonl [MAX_LEN]
input lines: {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}, ...]}
then:        dflash-pack --data out.jsonl --index out.idx   (once; later runs read out.idx)

Needs `transformers` (a tool outside the data path; the pipeline itself does not use Python).
The turn boundaries follow the speculators preprocessing (dflash-reference.md §1.2): the prompt
rendered with the generation prompt must be a prefix of the conversation rendered through that
assistant turn; the turn's closing template tokens (e.g. <|im_end|>) are supervised.
"""
import json
import sys


def render(tok, messages, gen_prompt):
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen_prompt)
    return tok(text, add_special_tokens=False)["input_ids"]


def turn_span(tok, messages, j):
    """[start, end) of assistant turn j in render(messages[:j+1])."""
    p, f = render(tok, messages[:j], True), render(tok, messages[:j + 1], False)
    if f[:len(p)] != p:  # the template re-renders earlier text: fall back to the common prefix
        start = next((i for i, (a, b) in enumerate(zip(p, f)) if a != b), min(len(p), len(f)))
        q = render(tok, messages[:j], False)
        if f[:len(q)] != q or len(q) > start:
            return None, f
        p = f[:start]
    return (len(p), len(f)), f


def rows(tok, messages, max_len):
    """One row per conversation with every assistant turn supervised when each turn renders as a
    prefix of the whole conversation; otherwise (templates that drop earlier turns' reasoning) one
    row per assistant turn."""
    turns = [j for j, m in enumerate(messages) if m["role"] == "assistant" and j > 0]
    full = render(tok, messages[:turns[-1] + 1], False) if turns else []
    mask, per_turn = [0] * len(full), []
    for j in turns:
        span, f = turn_span(tok, messages, j)
        if span is None:
            continue
        per_turn.append((f, span))
        if mask is not None and full[:len(f)] == f:
            mask[span[0]:span[1]] = [1] * (span[1] - span[0])
        else:
            mask = None
    out = [(full, mask)] if mask is not None else [(f, [0] * s + [1] * (e - s)) for f, (s, e) in per_turn]
    for ids, m in out:
        ids, m = ids[:max_len], m[:max_len]
        if any(m):
            yield {"input_ids": ids, "loss_mask": m}


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    max_len = int(sys.argv[4]) if len(sys.argv) > 4 else 8192
    with open(sys.argv[2]) as fin, open(sys.argv[3], "w") as fout:
        for line in fin:
            for row in rows(tok, json.loads(line)["messages"], max_len):
                fout.write(json.dumps(row, separators=(",", ":")) + "\n")
