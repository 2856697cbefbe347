#!/usr/bin/env python3
"""bench/bench_report.py — the table of scripts/bench.sh --gpu / --cpu-smoke (issue 21), from the phase outputs in
OUT_DIR, and its RESULTS.md entry.

    bench_report.py OUT_DIR [--append RESULTS.md] [--commit C] [--title T]

OUT_DIR holds what bench.sh wrote: phases.tsv (name, status ok|FAILED|skipped, seconds, reason), ceiling.txt
(bench/ceiling_bench), target.txt (bench/target_bench), train.txt (bench/train_bench), gpu-mem.csv (nvidia-smi
--query-compute-apps samples: pid, process name, MiB), pipeline/launch (epoch seconds when pipelines/train.sh
was started), pipeline/metrics.jsonl (the run's metrics sink file), pipeline/shape (one line). A missing input
makes its rows say n/a with the reason; it never invents a figure. Every row says what it covers.
Prints: part | figure | value | unit | covers; exit 0 (1 on unreadable input: a one-line error).
Only the standard library: it runs on the GPU machine's bare Python too.
"""
import datetime
import json
import os
import re
import sys


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


def num(pattern, text, group=1):
    if text is None:
        return None
    m = re.search(pattern, text, re.M)
    return float(m.group(group)) if m else None


def fmt(v, digits=1):
    if v is None:
        return "n/a"
    if isinstance(v, str):
        return v
    return f"{v:,.{digits}f}".replace(",", " ") if abs(v) >= 1000 else f"{v:.{digits}f}"


class Table:
    def __init__(self):
        self.rows = []

    def add(self, part, figure, value, unit, covers, digits=1):
        self.rows.append((part, figure, fmt(value, digits), unit, covers))

    def text(self):
        w = [max(len(r[i]) for r in self.rows + [("part", "figure", "value", "unit", "covers")]) for i in range(4)]
        out = [f"{'part':<{w[0]}} | {'figure':<{w[1]}} | {'value':>{w[2]}} | {'unit':<{w[3]}} | covers"]
        out.append("-" * (w[0] + 1) + "+" + "-" * (w[1] + 2) + "+" + "-" * (w[2] + 2) + "+" + "-" * (w[3] + 2) + "+------")
        for r in self.rows:
            out.append(f"{r[0]:<{w[0]}} | {r[1]:<{w[1]}} | {r[2]:>{w[2]}} | {r[3]:<{w[3]}} | {r[4]}")
        return "\n".join(out)


def phases(out):
    p = {}
    t = read(os.path.join(out, "phases.tsv")) or ""
    for ln, line in enumerate(t.splitlines(), 1):
        f = line.split("\t")
        if len(f) < 3:
            raise ValueError(f"{out}/phases.tsv:{ln}: expected name<TAB>status<TAB>seconds[<TAB>reason], got {line!r}")
        p[f[0]] = (f[1], float(f[2]), f[3] if len(f) > 3 else "")
    return p


def why(ph, name):
    s = ph.get(name)
    if s is None:
        return "phase not run"
    return f"{s[0]}: {s[2]}" if s[2] else s[0]


def gpu_mem(out, name="gpu-mem.csv"):
    """peak MiB per process name (basename) over the samples, or None without samples"""
    t = read(os.path.join(out, name))
    if not t:
        return None
    peak = {}
    for line in t.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) != 3 or not f[2].isdigit():
            continue   # headers, "[N/A]", "No running processes found"
        name = os.path.basename(f[1])
        peak[name] = max(peak.get(name, 0), int(f[2]))
    return peak


def metrics(path, ln_hint):
    recs = []
    t = read(path)
    if t is None:
        return None
    for ln, line in enumerate(t.splitlines(), 1):
        if not line.strip():
            continue
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{ln}: not JSON ({e.msg})")
    return recs


def sections(text):
    """[(variant name, text)] of train_bench's "=== variant NAME: ..." sections; [("", text)] without markers"""
    if text is None:
        return [("", None)]
    parts = re.split(r"^=== variant (\S+?):.*$", text, flags=re.M)
    if len(parts) == 1:
        return [("", text)]
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


def pipeline_rows(tab, ph, phname, pdir, sfx, mem, mem_note, peak, tgf, rgf):
    recs = metrics(os.path.join(pdir, "metrics.jsonl"), "pipeline")
    launch = num(r"^([0-9.]+)", read(os.path.join(pdir, "launch")))
    steps = [x for x in recs or [] if x.get("stage") == "dflash-train" and x.get("kind") == "metric" and "loss" in x]
    tsum = [x for x in recs or [] if x.get("stage") == "dflash-train" and x.get("kind") == "summary"]
    pwhy = why(ph, phname)
    if steps and tsum and launch:
        n = len(steps)
        tok = float(tsum[-1].get("tokens", 0))
        per = tok / n if n else 0
        t1, tn = steps[0]["t"], steps[-1]["t"]
        steady = per * (n - 1) / (tn - t1) if n > 1 and tn > t1 else None
        whole = tok / (tn - launch) if tn > launch else None
        tab.add("pipeline", "steady rate" + sfx, steady, "tok/s",
                f"trainer: {n - 1} steps x {fmt(per, 0)} tokens (mean) between the 1st and last optimizer step; no load",
                0)
        tab.add("pipeline", "launch to last optimizer step" + sfx, whole, "tok/s",
                f"all {int(tok)} trained tokens / (last step - train.sh start): model load, init, warm-up included", 0)
        tab.add("pipeline", "launch to first optimizer step" + sfx, t1 - launch, "s",
                "train.sh start (dataset index, rings, target load, trainer init) to the 1st step's metric")
        gf = (tgf or 0) + (rgf or 0)
        tab.add("pipeline", "MFU vs measured GEMM peak (steady)" + sfx,
                100 * steady * gf / 1e3 / peak if steady and tgf and rgf and peak else None, "%",
                f"steady tok/s x ({fmt(tgf, 2)} target + {fmt(rgf, 2)} trainer GFLOP/token, from the alone runs) / peak"
                if steady and tgf and rgf and peak else "needs target_bench, train_bench and the ceiling")
    else:
        for f in ("steady rate", "launch to last optimizer step"):
            tab.add("pipeline", f + sfx, None, "tok/s", pwhy if pwhy != "ok" else "no dflash-train step in metrics.jsonl")
        tab.add("pipeline", "launch to first optimizer step" + sfx, None, "s", pwhy)
        tab.add("pipeline", "MFU vs measured GEMM peak (steady)" + sfx, None, "%", pwhy)
    stages = ["dflash-pack", "dflash-target", "dflash-hspack", "dflash-train"]
    for s in stages:
        summ = [x for x in recs or [] if x.get("stage") == s and x.get("kind") == "summary"]
        hb = [x for x in recs or [] if x.get("stage") == s and x.get("kind") == "heartbeat"]
        src = summ[-1] if summ else (hb[-1] if hb else None)
        if src and src.get("busy_s", 0) + src.get("wait_s", 0) > 0:
            b, w = float(src["busy_s"]), float(src["wait_s"])
            tab.add("pipeline", f"{s} busy / wait" + sfx, 100 * b / (b + w), "% busy",
                    f"busy {b:.1f} s, wait {w:.1f} s ({'summary' if summ else 'last heartbeat'}; wait = on its rings)")
        else:
            tab.add("pipeline", f"{s} busy / wait" + sfx, None, "% busy", pwhy if pwhy != "ok" else "no record")
    tlog = read(os.path.join(pdir, "logs", "dflash-train.log"))
    tlog_gib = num(r"peak device memory ([0-9.]+) GiB in use", tlog)
    for s in ["dflash-shm"] + stages:
        have = mem is not None and s in mem
        if have:
            tab.add("pipeline", f"{s} peak GPU memory" + sfx, mem[s] / 1024, "GiB",
                    mem_note + ("; the device rings" if s == "dflash-shm" else ""), 2)
            continue
        own = [float(x["gpu_mem_bytes"]) for x in recs or [] if x.get("stage") == s and "gpu_mem_bytes" in x]
        if own and max(own) > 0:   # the stage's own count (nvidia-smi saw no process: e.g. another PID namespace)
            tab.add("pipeline", f"{s} peak GPU memory" + sfx, max(own) / 2**30, "GiB",
                    "max of the stage's heartbeat gpu_mem_bytes (its own allocations)", 2)
        elif s == "dflash-train" and tlog_gib is not None:
            tab.add("pipeline", f"{s} peak GPU memory" + sfx, tlog_gib, "GiB",
                    "trainer's log after start-up: cudaMemGetInfo, every process on the device counts", 2)
        else:
            tab.add("pipeline", f"{s} peak GPU memory" + sfx, None, "GiB",
                    "no nvidia-smi sample of this process (no device memory, or it ran < 0.5 s)" if mem is not None
                    else "no nvidia-smi samples", 2)


def report(out):
    ph = phases(out)
    tab = Table()
    mem = gpu_mem(out)
    mem_note = "nvidia-smi per-process used memory, sampled every 0.5 s"

    # ---- ceilings
    c = read(os.path.join(out, "ceiling.txt"))
    peak = num(r"^RESULT ceiling gemm_bf16 n (\d+) TFLOP/s best ([0-9.]+)", c, 2)
    gn = num(r"^RESULT ceiling gemm_bf16 n (\d+)", c)
    gmed = num(r"^RESULT ceiling gemm_bf16 .* median ([0-9.]+)", c)
    bw = num(r"^RESULT ceiling d2d_copy MiB (\d+) TB/s best ([0-9.]+)", c, 2)
    bmib = num(r"^RESULT ceiling d2d_copy MiB (\d+)", c)
    tab.add("ceiling", "bf16 GEMM peak", peak, "TFLOP/s",
            f"cuBLASLt (blas_matmul) {int(gn)}^3, best of the timed calls (median {fmt(gmed)}), this run"
            if peak else why(ph, "ceiling"))
    tab.add("ceiling", "device-to-device copy", bw, "TB/s",
            f"cudaMemcpy D2D of {int(bmib)} MiB, bytes read + written, best of the timed copies, this run"
            if bw else why(ph, "ceiling"), 2)

    # ---- target alone
    t = read(os.path.join(out, "target.txt"))
    ttps = num(r"^RESULT target_forward tokens/s ([0-9.]+)", t)
    tgf = num(r"([0-9.]+) GFLOP/token", t)
    tinit = num(r"\(init ([0-9.]+) s\)", t)
    cov = "target_bench: median batch of 8192 tokens after warm-up; weights generated on the GPU (no load)"
    tab.add("target", "target forward alone", ttps, "tok/s", cov if ttps else why(ph, "target"), 0)
    tab.add("target", "MFU vs measured GEMM peak", 100 * ttps * tgf / 1e3 / peak if ttps and tgf and peak else None,
            "%", f"tok/s x {fmt(tgf, 2)} GFLOP/token (matmuls + causal attention) / the peak above"
            if ttps and tgf and peak else "needs target_bench and the ceiling")
    tab.add("target", "start-up (weights on the GPU)", tinit, "s", "target_init incl. random weights; not a load from disk"
            if tinit is not None else why(ph, "target"))
    tab.add("target", "peak GPU memory", mem.get("target_bench", 0) / 1024 if mem and "target_bench" in mem else None,
            "GiB", mem_note if mem and "target_bench" in mem else "no nvidia-smi sample of target_bench", 2)

    # ---- trainer alone: one section per optimizer x accumulation variant ("=== variant NAME: ..." lines of
    # train_bench --variants; a train.txt without them is one unnamed section)
    r = read(os.path.join(out, "train.txt"))
    rfirst = num(r"^time from launch to the first optimizer step: ([0-9.]+) s", r)
    rgf_of = {}
    for vname, sec in sections(r):
        sfx = f" [{vname}]" if vname else ""
        rtps = num(r"^trainer: ([0-9.]+) tokens/s", sec)
        rtf = num(r"^trainer: .* ([0-9.]+) TFLOP/s model FLOPs", sec)
        rsteps = num(r"^trainer: [0-9.]+ tokens/s over (\d+) steps", sec)
        rmem = num(r"^device memory in use after start-up: ([0-9.]+) GiB", sec)
        ropt = num(r"^  optimizer \([^)]*\) +([0-9.]+)", sec)
        rns = num(r"Muon Newton-Schulz +[0-9.]+ TFLOP per step, ([0-9.]+) TFLOP/s", sec)
        rgf = rtf * 1e3 / rtps if rtf and rtps else None   # GFLOP per token of a training step
        rgf_of[vname] = rgf
        tab.add("train", "trainer alone" + sfx, rtps, "tok/s",
                f"train_bench: {int(rsteps)} optimizer steps after warm-up, synthetic features (no target)"
                if rtps else why(ph, "train"), 0)
        tab.add("train", "MFU vs measured GEMM peak" + sfx, 100 * rtf / peak if rtf and peak else None, "%",
                f"{fmt(rtf)} TFLOP/s of step FLOPs ({fmt(rgf, 2)} GFLOP/token; Newton-Schulz not counted) / the peak above"
                if rtf and peak else "needs train_bench and the ceiling")
        tab.add("train", "optimizer step" + sfx, ropt, "ms",
                "CUDA events around optim_gpu_step, mean per optimizer step" + (
                    f"; Muon Newton-Schulz at {fmt(rns)} TFLOP/s over it" if rns else "")
                if ropt is not None else why(ph, "train"), 2)
        tab.add("train", "peak GPU memory" + sfx,
                mem["train_bench"] / 1024 if mem and "train_bench" in mem and not vname else rmem, "GiB",
                mem_note if mem and "train_bench" in mem and not vname else
                ("train_bench: cudaMemGetInfo after this variant's start-up (whole device)" if rmem else why(ph, "train")),
                2)
    tab.add("train", "launch to first optimizer step", rfirst, "s",
            "process start to the first step done: init, uploads, warm-up" if rfirst is not None else why(ph, "train"))

    # ---- whole pipeline: one run per variant (pipeline/VARIANT/, listed in pipeline/variants), or the layout before
    # issue 28 (one run in pipeline/)
    pdir0 = os.path.join(out, "pipeline")
    vlist = [v for v in (read(os.path.join(pdir0, "variants")) or "").split() if v]
    runs = [(v, os.path.join(pdir0, v), f"pipeline.{v}", f"gpu-mem-{v}.csv") for v in vlist] or \
           [("", pdir0, "pipeline", "gpu-mem.csv")]
    for vname, pdir, phname, memfile in runs:
        sfx = f" [{vname}]" if vname else ""
        pmem = gpu_mem(out, memfile)
        # the matching trainer-alone variant's GFLOP/token (muon-ga4 runs muon's step A times: the same per token)
        # ("+mps": the same variant with target and trainer under one MPS server)
        base = vname.split("+")[0]
        rgf = rgf_of.get(base, rgf_of.get(base.split("-ga")[0], rgf_of.get("")))
        pipeline_rows(tab, ph, phname, pdir, sfx, pmem, mem_note, peak, tgf, rgf)
    return tab


def main(argv):
    if len(argv) < 2 or argv[1].startswith("-"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out = argv[1]
    opts = {"--append": None, "--commit": "?", "--title": "bench.sh"}
    i = 2
    while i < len(argv):
        if argv[i] not in opts or i + 1 >= len(argv):
            print(f"bench_report.py: unknown or incomplete argument '{argv[i]}'", file=sys.stderr)
            return 2
        opts[argv[i]] = argv[i + 1]
        i += 2
    try:
        tab = report(out)
    except ValueError as e:
        print(f"bench_report.py: {e}", file=sys.stderr)
        return 1
    shape = (read(os.path.join(out, "pipeline", "shape")) or "shape not recorded").strip()
    text = tab.text()
    print(text)
    if opts["--append"]:
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        with open(opts["--append"], "a", encoding="utf-8") as f:
            f.write(f"\n## {opts['--title']} — {now}, commit {opts['--commit']}\n")
            f.write(f"Shape: {shape}\n\n```\n{text}\n```\n")
        print(f"appended to {opts['--append']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
