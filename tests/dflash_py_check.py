# tests/dflash_py_check.py EXPORT_DIR TARGET_DIR INPUT_JSON - run by tests/test_export.c (dflash_py_matches_eval):
# load a z-lab export through its dflash.py (AutoModel, trust_remote_code), run one drafting pass on the features
# dflash-eval's proposer used, and compare the draft tokens (exactly) and the block's final-normed states
# (|py - c| <= 1e-4 + 1e-4 |c|) with what the C proposer produced. Prints one line; exit 0 on agreement, 1 on a
# difference, 77 when torch or transformers cannot be imported (the C test then prints that it skipped).
import json
import sys

try:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel
except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
    print(f"skipped: python3 cannot import torch / transformers / safetensors ({e})")
    sys.exit(77)

export_dir, target_dir, inputs = sys.argv[1:4]
x = json.load(open(inputs))
try:
    model = AutoModel.from_pretrained(export_dir, trust_remote_code=True, dtype=torch.float32)
except TypeError:
    model = AutoModel.from_pretrained(export_dir, trust_remote_code=True, torch_dtype=torch.float32)
model.eval()
w = load_file(f"{target_dir}/model.safetensors")
embed = w["model.embed_tokens.weight"].float()
head = w.get("lm_head.weight", w["model.embed_tokens.weight"]).float()
feats = torch.tensor(x["features"], dtype=torch.float32)
tok, logits = model.draft(feats, x["anchor"], embed, head)
ids = [int(t) for t in tok]
ids_ = torch.full((model.block_size,), model.mask_token_id, dtype=torch.long)
ids_[0] = x["anchor"]
with torch.no_grad():
    xn = model(feats, embed[ids_])
want = torch.tensor(x["xn"], dtype=torch.float32)
err = (xn - want).abs()
bound = 1e-4 + 1e-4 * want.abs()
worst = int(torch.argmax(err - bound))
ok = bool((err <= bound).all()) and ids == x["draft"]
print(f"dflash.py: draft {ids} (dflash-eval {x['draft']}), max |xn diff| {float(err.max()):.3g} at {worst}; "
      f"causal {model.causal}, sliding {model.sliding}, window {model.window}, pruned {model.pruned}: "
      f"{'agree' if ok else 'DIFFER'}")
sys.exit(0 if ok else 1)
