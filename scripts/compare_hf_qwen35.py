#!/usr/bin/env python3
"""scripts/compare_hf_qwen35.py — cross-check the Qwen3.5 / Qwen3.6 hybrid target (CPU, fp32) against
transformers' own implementation (Qwen3_5ForCausalLM) loading the SAME checkpoint files (issue 19).

For each case below (tiny random hybrid models of several shapes: GQA in both mixers, partial and
full rotary, conv kernels 2..4, tied and untied heads; documents of awkward lengths including 1):
  1. write the model with dflash-mkmodel (fp32 on disk, flags below, deterministic),
  2. pack the documents into one batch and run `dflash-target --device cpu --docs F --dump OUT`,
  3. run transformers in fp32 on each document ON ITS OWN (positions 0..len-1, no cache: its
     forward takes the chunked gated-delta-rule and the torch causal conv1d), and
  4. compare per document and captured layer (z-lab id i = output of decoder layer i = HF
     hidden_states[i + 1]; `last` = the last decoder layer's output BEFORE the final norm, read with
     a forward hook).
Pass: relative L2 (||ours - hf|| / ||hf||) <= 1e-5 for every (case, document, layer).

--write-ref FILE stores transformers' outputs (and the inputs) as one small safetensors file, the
stored reference that tests/test_qwen35.c compares the C forward with, so CI needs no Python ML
stack. The C test regenerates the same models with the flags recorded in the file's metadata.

Usage (repository root, after `make CUDA=0`):
  python3 scripts/compare_hf_qwen35.py --bin build/bin                # cross-check, exit 1 on failure
  python3 scripts/compare_hf_qwen35.py --bin build/bin --write-ref tests/data/qwen35_ref.safetensors
Needs numpy, torch and transformers >= 5 (models/qwen3_5).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

TOL = 1e-5

# name, dflash-mkmodel flags, document lengths, captured z-lab layer ids
CASES = [
    ("a", "--preset qwen3.5-tiny --std 0.15 --embed-std 1.0 --lm-head-std 0.45 --seed 11",
     [1, 7, 23, 2, 30], [0, 1, 2]),
    ("b", "--preset qwen3.5-tiny --hidden 48 --heads 6 --kv-heads 3 --head-dim 8 --rotary-dim 8 --lin-k-heads 1 "
          "--lin-v-heads 3 --lin-k-dim 16 --lin-v-dim 8 --conv-kernel 3 --layers 5 --full-every 3 --intermediate 80 "
          "--vocab 300 --tied --std 0.15 --embed-std 1.0 --seed 12",
     [13, 1, 1, 40], [0, 2, 3]),
    ("c", "--preset qwen3.5-tiny --hidden 32 --heads 2 --kv-heads 1 --head-dim 32 --rotary-dim 4 --lin-k-heads 3 "
          "--lin-v-heads 3 --lin-k-dim 4 --lin-v-dim 4 --conv-kernel 2 --layers 3 --full-every 3 --intermediate 64 "
          "--vocab 200 --std 0.2 --embed-std 1.0 --lm-head-std 0.45 --seed 13",
     [64, 5], [1, 2]),
]


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        b, e = v["data_offsets"]
        dt = {"F32": np.float32, "I32": np.int32, "I64": np.int64}[v["dtype"]]
        out[name] = np.frombuffer(body[b:e], dtype=dt).reshape(v["shape"])
    return out


def write_safetensors(path, tensors, metadata):
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        dt = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}[a.dtype]
        b = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    os.replace(tmp, path)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
        raise SystemExit(f"command failed with exit {r.returncode}: {cmd[0]}")
    return r


def docs_for(case, vocab):
    """Deterministic token ids (a fixed LCG, so the C test could rebuild them; they are stored anyway)."""
    name, _, lens, _ = case
    s = 0x9E3779B97F4A7C15 ^ ord(name)
    docs = []
    for n in lens:
        d = []
        for _ in range(n):
            s = (s * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
            d.append((s >> 33) % vocab)
        docs.append(d)
    return docs


def hf_states(model_dir, docs, layers):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    if type(model).__name__ != "Qwen3_5ForCausalLM":
        raise SystemExit(f"transformers loaded {type(model).__name__}, expected Qwen3_5ForCausalLM")
    blocks = model.model.layers
    n = len(blocks)
    captured = {}

    def hook(i):
        def fn(_module, _inp, out):
            captured[i] = (out[0] if isinstance(out, (tuple, list)) else out).detach()
        return fn

    handles = [blocks[i].register_forward_hook(hook(i)) for i in range(n)]
    per_doc = []
    with torch.no_grad():
        for doc in docs:
            captured.clear()
            ids = torch.tensor([doc], dtype=torch.long)
            out = model.model(input_ids=ids, output_hidden_states=True, use_cache=False)
            hs = out.hidden_states
            for i in range(n - 1):   # pins the z-lab mapping: hidden_states[i+1] is layer i's output
                if not torch.equal(hs[i + 1][0], captured[i][0]):
                    raise SystemExit(f"mapping check failed: hidden_states[{i + 1}] != output of layer {i}")
            per_doc.append(([captured[i][0].numpy().copy() for i in layers], captured[n - 1][0].numpy().copy()))
    for h in handles:
        h.remove()
    return per_doc


def rel_l2(a, b):
    return float(np.linalg.norm((a - b).astype(np.float64)) / (np.linalg.norm(b.astype(np.float64)) + 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin", help="directory with dflash-target and dflash-mkmodel")
    ap.add_argument("--write-ref", default=None, help="store transformers' outputs here (safetensors) and exit")
    ap.add_argument("--long", type=int, default=0, help="cross-check only: add one document of this many tokens "
                                                        "to every case (error growth with length)")
    args = ap.parse_args()
    try:
        import torch
        import transformers
        from transformers.models.qwen3_5 import modeling_qwen3_5  # noqa: F401
    except ImportError as e:
        print(f"compare_hf_qwen35: SKIP: needs torch and transformers>=5 with models/qwen3_5 ({e})")
        sys.exit(77)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    work = tempfile.mkdtemp(prefix="dflash-compare-hf-qwen35-")
    mk, tg = os.path.join(args.bin, "dflash-mkmodel"), os.path.join(args.bin, "dflash-target")
    tensors, meta, failures = {}, {"generator": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                                             "fp32 CPU, each document alone (scripts/compare_hf_qwen35.py)"}, 0
    print(f"{'case':4} {'state':8} {'doc':>4} {'len':>5} {'rel L2':>10} {'max abs':>10}  (tolerance {TOL:g})")
    for case in CASES:
        if args.long and not args.write_ref:
            case = (case[0], case[1], case[2] + [args.long], case[3])
        name, flags, lens, layers = case
        mdir = os.path.join(work, name)
        run([mk, "--out", mdir, "--dtype", "f32", "--threads", "1"] + flags.split())
        cfg = json.load(open(os.path.join(mdir, "config.json")))
        docs = docs_for(case, cfg["vocab_size"])
        ref = hf_states(mdir, docs, layers)
        cu = np.cumsum([0] + [len(d) for d in docs]).astype(np.int32)
        if args.write_ref:
            tensors[f"{name}.ids"] = np.array([t for d in docs for t in d], dtype=np.int32)
            tensors[f"{name}.cu"] = cu
            tensors[f"{name}.layers"] = np.array(layers, dtype=np.int32)
            tensors[f"{name}.states"] = np.stack([np.concatenate([r[0][j] for r in ref]) for j in range(len(layers))])
            tensors[f"{name}.last"] = np.concatenate([r[1] for r in ref])
            meta[f"{name}.mkmodel"] = flags
            continue
        docs_path, dump = os.path.join(work, f"{name}-docs.json"), os.path.join(work, f"{name}-dump.safetensors")
        json.dump({"docs": docs}, open(docs_path, "w"))
        run([tg, "--model", mdir, "--device", "cpu", "--layers", ",".join(map(str, layers)),
             "--tokens", str(int(cu[-1])), "--docs", docs_path, "--dump", dump])
        ours = read_safetensors(dump)
        for d, (states, last) in enumerate(ref):
            lo, hi = int(cu[d]), int(cu[d + 1])
            pairs = [(f"id {layers[j]}", ours["states"][j][lo:hi], states[j]) for j in range(len(layers))]
            pairs.append(("last", ours["last"][lo:hi], last))
            for label, a, b in pairs:
                e, m = rel_l2(a, b), float(np.max(np.abs(a - b)))
                bad = not (e <= TOL)
                failures += bad
                print(f"{name:4} {label:8} {d:>4} {hi - lo:>5} {e:>10.3g} {m:>10.3g}{'  FAIL' if bad else ''}")
    if args.write_ref:
        write_safetensors(args.write_ref, tensors, meta)
        print(f"compare_hf_qwen35: wrote {args.write_ref} ({os.path.getsize(args.write_ref)} bytes)")
        return
    print(f"compare_hf_qwen35: {failures} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
