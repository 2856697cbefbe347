# dflash.py - the transformers modeling file of a dflash-pipe z-lab export (written by dflash-export next to
# config.json, which names it in auto_map: AutoModel -> dflash.DFlashDraftModel).
#
#   model = AutoModel.from_pretrained(EXPORT_DIR, trust_remote_code=True, dtype=torch.float32)
#   tokens, logits = model.draft(features, anchor_token_id, target_embed_weight, target_lm_head_weight)
#
# One drafting pass runs the masks dflash-train trained with (dflash-reference.md section 6), not z-lab's
# bidirectional no-mask inference: the block [anchor, mask x (B-1)] sits at positions a .. a+B-1 after a context
# of the captured target features of positions 0 .. a-1; a context key p is visible when the layer is full or
# p >= a - W (sliding window W); a block key j' is visible to slot j when the layer is bidirectional or j' <= j
# (causal). Per-layer causality is dflash_pipe.causal (what training meant), else the loaders' rule (is_causal,
# then dflash_config.causal, else sliding => causal). A pruned draft vocabulary ships lm_head.weight [V_d, H] and
# d2t (target id = draft id + d2t[draft id]); otherwise the target's LM head is passed in. Plain torch, fp32
# arithmetic in the weights' dtype; no KV cache (one block per call). Written for dflash-pipe, not copied from a
# loader; checked against dflash-eval's proposer by tests/test_export.c (tests/dflash_py_check.py).
import math

import torch
from torch import nn
from transformers import PreTrainedModel, Qwen3Config


def _get(cfg, key, default=None):
    return cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)


def _rope_theta_and_scaling(config):
    params = getattr(config, "rope_parameters", None)   # transformers >= 5
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"]), params
    return float(getattr(config, "rope_theta", 10000.0)), getattr(config, "rope_scaling", None)


class DFlashRMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(self.weight.dtype)


class DFlashMLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class DFlashAttention(nn.Module):
    def __init__(self, config, sliding, causal, window):
        super().__init__()
        self.n_h = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.d_h = getattr(config, "head_dim", None) or config.hidden_size // self.n_h
        H = config.hidden_size
        self.q_proj = nn.Linear(H, self.n_h * self.d_h, bias=False)
        self.k_proj = nn.Linear(H, self.n_kv * self.d_h, bias=False)
        self.v_proj = nn.Linear(H, self.n_kv * self.d_h, bias=False)
        self.o_proj = nn.Linear(self.n_h * self.d_h, H, bias=False)
        self.q_norm = DFlashRMSNorm(self.d_h, config.rms_norm_eps)
        self.k_norm = DFlashRMSNorm(self.d_h, config.rms_norm_eps)
        self.sliding, self.causal, self.window = sliding, causal, window

    def forward(self, x, ctx, cos_ctx, sin_ctx, cos_blk, sin_blk, anchor_pos, ctx_pos):
        B, n = x.shape[0], ctx.shape[0]
        q = self.q_norm(self.q_proj(x).view(B, self.n_h, self.d_h))
        k = self.k_norm(torch.cat([self.k_proj(ctx), self.k_proj(x)], 0).view(n + B, self.n_kv, self.d_h))
        v = torch.cat([self.v_proj(ctx), self.v_proj(x)], 0).view(n + B, self.n_kv, self.d_h)
        cos_k, sin_k = torch.cat([cos_ctx, cos_blk], 0), torch.cat([sin_ctx, sin_blk], 0)
        q = q * cos_blk[:, None, :] + _rotate_half(q) * sin_blk[:, None, :]
        k = k * cos_k[:, None, :] + _rotate_half(k) * sin_k[:, None, :]
        # the trained mask: context strictly before the anchor (inside the window on sliding layers), own block
        # (causal layers: slots j' <= j)
        visible = torch.ones(B, n + B, dtype=torch.bool, device=x.device)
        if self.sliding:
            visible[:, :n] = (ctx_pos >= anchor_pos - self.window)[None, :]
        if self.causal:
            visible[:, n:] = torch.tril(torch.ones(B, B, dtype=torch.bool, device=x.device))
        group = self.n_h // self.n_kv
        k = k.repeat_interleave(group, dim=1)   # (n+B, n_h, d_h)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.d_h)
        scores = scores.masked_fill(~visible[None], float("-inf"))
        p = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        o = torch.einsum("hqk,khd->qhd", p, v).reshape(B, self.n_h * self.d_h)
        return self.o_proj(o)


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config, sliding, causal, window):
        super().__init__()
        self.input_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config, sliding, causal, window)
        self.post_attention_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DFlashMLP(config.hidden_size, config.intermediate_size)

    def forward(self, x, ctx, *rope):
        h = x + self.self_attn(self.input_layernorm(x), ctx, *rope)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraftModel(PreTrainedModel):
    config_class = Qwen3Config
    base_model_prefix = "dflash_draft"   # the export's names are unprefixed (fc.weight, layers.0. ...)
    _no_split_modules = ["DFlashDecoderLayer"]

    def __init__(self, config):
        super().__init__(config)
        dc = _get(config, "dflash_config", None) or {}
        pipe = _get(config, "dflash_pipe", None) or {}
        L = config.num_hidden_layers
        types = list(_get(config, "layer_types", None) or ["full_attention"] * L)
        self.sliding = [t == "sliding_attention" for t in types]
        is_causal, causal_dc = _get(config, "is_causal", None), _get(dc, "causal", None)
        if _get(pipe, "causal", None) is not None:
            self.causal = [bool(c) for c in pipe["causal"]]
        elif is_causal is not None:
            self.causal = [bool(is_causal)] * L
        elif causal_dc is not None:
            self.causal = [bool(causal_dc)] * L
        else:
            self.causal = list(self.sliding)
        window = _get(dc, "swa_window_size", None) or _get(config, "sliding_window", None) or 0
        if any(self.sliding) and window < 1:
            raise ValueError("dflash.py: a sliding layer needs sliding_window (or dflash_config.swa_window_size)")
        self.window = int(window)
        self.target_layer_ids = list(dc["target_layer_ids"])
        self.mask_token_id = int(dc["mask_token_id"])
        self.block_size = int(_get(dc, "block_size", None) or _get(config, "block_size"))
        self.theta, scaling = _rope_theta_and_scaling(config)
        rtype = _get(scaling, "rope_type", _get(scaling, "type", "default")) if scaling else "default"
        if rtype not in ("default", None):
            raise NotImplementedError(f"dflash.py: rope type {rtype!r} is not implemented here")
        H, k = config.hidden_size, len(self.target_layer_ids)
        self.layers = nn.ModuleList(
            [DFlashDecoderLayer(config, self.sliding[i], self.causal[i], self.window) for i in range(L)])
        self.fc = nn.Linear(k * H, H, bias=False)
        self.hidden_norm = DFlashRMSNorm(H, config.rms_norm_eps)
        self.norm = DFlashRMSNorm(H, config.rms_norm_eps)
        V, V_d = config.vocab_size, int(_get(config, "draft_vocab_size", None) or config.vocab_size)
        self.pruned = V_d < V
        if self.pruned:   # the pruned head and its ids (vLLM's d2t convention)
            self.lm_head = nn.Linear(H, V_d, bias=False)
            self.register_buffer("d2t", torch.zeros(V_d, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(V, dtype=torch.bool))
        self.post_init()

    def _init_weights(self, module):   # every weight comes from the export
        pass

    def _rope(self, pos, dtype):
        d_h = self.layers[0].self_attn.d_h
        inv = 1.0 / (self.theta ** (torch.arange(0, d_h, 2, dtype=torch.int64).float() / d_h))
        f = pos.float()[:, None] * inv[None, :]
        emb = torch.cat([f, f], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, target_hidden, noise_embedding, anchor_position=None):
        """One block. target_hidden [n, k*H]: the captured features of positions 0..n-1 (strictly before the
        anchor); noise_embedding [B, H]: the target's embedding of [anchor, mask x (B-1)]; the anchor sits at
        position n unless anchor_position says otherwise. Returns the block's final-normed states [B, H]."""
        n, B = target_hidden.shape[0], noise_embedding.shape[0]
        a = n if anchor_position is None else int(anchor_position)
        dtype = self.fc.weight.dtype
        ctx = self.hidden_norm(self.fc(target_hidden.to(dtype)))
        ctx_pos = torch.arange(a - n, a, device=ctx.device)
        cos_c, sin_c = self._rope(ctx_pos, dtype)
        cos_b, sin_b = self._rope(torch.arange(a, a + B, device=ctx.device), dtype)
        x = noise_embedding.to(dtype)
        for layer in self.layers:
            x = layer(x, ctx, cos_c, sin_c, cos_b, sin_b, a, ctx_pos)
        return self.norm(x)

    @torch.no_grad()
    def draft(self, target_hidden, anchor_token_id, embed_tokens, lm_head=None):
        """The B-1 draft tokens (target ids, greedy) after the anchor, and their logits [B-1, V_d].
        embed_tokens: the target's embedding weight [V, H]; lm_head: the target's LM head weight [V, H]
        (ignored when the export carries a pruned head)."""
        B = self.block_size
        ids = torch.full((B,), self.mask_token_id, dtype=torch.long)
        ids[0] = int(anchor_token_id)
        x = self.forward(target_hidden, embed_tokens[ids])
        head = self.lm_head.weight if self.pruned else lm_head
        if head is None:
            raise ValueError("dflash.py: pass the target's LM head (this export has none of its own)")
        logits = x[1:] @ head.to(x.dtype).T
        tok = logits.argmax(-1)
        if self.pruned:
            tok = tok + self.d2t[tok]
        return tok, logits
