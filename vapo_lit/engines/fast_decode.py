"""A fast token loop for Llama-family causal LMs (Llama, Qwen2, Mistral): a preallocated KV cache
written in place, finished rows dropped from the batch as they end, and the decoder layers run as
a short sequence of calls on the model's own weights and modules (its projections, norms, MLPs
and rotary embedding), so the numbers are transformers' own. What it skips is transformers'
per-token bookkeeping (the cache re-concatenated at every token, masks rebuilt from scratch,
generic dispatch), which dominates small models' sampling time. Where a layer's projections are
plain `nn.Linear`s, q/k/v and the MLP's gate/up are applied as one matrix product each (their
weights concatenated once per rollout) and RMSNorm as torch's fused `rms_norm` (in float32, as
transformers computes it); anything else (adapters, quantised layers) is called as a module.
The concatenated copy lives for the rollout, so it is made only while it stays under
`FUSE_MAX_BYTES`: small models, whose token step is dominated by per-call costs; a large model's
matrix products dwarf those, and its memory is better spent on the KV cache.

The prompt is encoded by the model's regular forward (prefill); its cache is copied once into the
static buffers, kept in the compute dtype (`compute_dtype`: bf16 under bf16 autocast or bf16
weights, not the float32 the rotary tables would promote the keys to). Grouped-query heads share
their K/V without per-query-head copies (7x the cache's size per layer for a 7:1 model). The
token step's attention reads only the live prefix, with no mask unless a prompt was left-padded
(then an additive bias on the prompt's columns only) or the rows stand at different columns; on
the CPU in float32/64 it is two batched matrix products over the cache's own storage, elsewhere
SDPA's decode kernels (`attend`). The rotary cos/sin come from a table made once per rollout; q and
k are rotated as one tensor. At
long responses the step is bound by reading every row's K/V cache once per token, not by its
FLOPs: `benchmarks/generate.py --long` prints the step against both bounds. Dropping finished
rows compacts each layer's cache in place (no second cache beside the first). `extend` appends a
block of up to K tokens per row in one forward pass (a tool observation in a multi-turn episode),
each row at its own next column, so that no row's cache has holes and none grows past its budget;
from then on the rows stand at different columns and every step masks each row's keys past its
own. `decode_supported(model)` says whether a model can use this loop;
`vapo_lit.engines.hf.generate` falls back to transformers' forward otherwise. Equality with that
forward (tokens, behaviour log-probs) is tested in tests/test_rollout.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
FUSE_MAX_BYTES = 256 * 2**20
"""Largest concatenated copy of the q/k/v and gate/up weights (all layers) the loop makes."""


def decode_supported(model) -> bool:
    """A Llama-family model whose attention is plain causal self-attention (no sliding window,
    no logit soft-capping), with its layers where this loop expects them."""
    if type(model).__name__ not in SUPPORTED:
        return False
    cfg = model.config
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "sliding_window", None) not in (None, 0):
        return False
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "attn_logit_softcapping", None):
        return False
    inner = getattr(model, "model", None)
    return all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))


class StaticDecoder:
    """KV cache of `batch` rows x `capacity` columns per layer (plus one scratch column), filled from
    a prefill cache, then extended one token (`step`) or one block of tokens (`extend`) at a time
    for the rows still active."""

    def __init__(self, model, prefill_cache, key_valid: torch.Tensor, capacity: int):
        self.model, self.inner = model, model.model
        layers = self.inner.layers
        n, P = key_valid.shape
        dtype = compute_dtype(model)
        self.k, self.v = [], []
        for i, layer in enumerate(layers):
            pk, pv = _layer_kv(prefill_cache, i)
            k = pk.new_zeros((n, pk.shape[1], capacity + 1, pk.shape[3]), dtype=dtype)
            v = pv.new_zeros((n, pv.shape[1], capacity + 1, pv.shape[3]), dtype=dtype)
            k[:, :, :P] = pk
            v[:, :, :P] = pv
            self.k.append(k)
            self.v.append(v)
        fuse = _fused_bytes(layers) <= FUSE_MAX_BYTES
        self.fused = [_FusedLayer(layer, fuse) for layer in layers]
        self.key_valid = key_valid.bool()  # (n, P): the prompt's keys (every response key is valid)
        self.length = P  # columns in use (the longest row's)
        self.capacity = capacity  # column `capacity` is the scratch a block's unused columns are written to
        self.next_col = None  # (n,) each row's next column once rows stand at different columns, else None
        self.rows = torch.arange(n, device=key_valid.device)  # original row of each cache row
        self.prompt_bias = (
            None
            if bool(self.key_valid.all())
            else torch.zeros((n, 1, P), dtype=dtype, device=key_valid.device).masked_fill_(
                ~self.key_valid[:, None], float("-inf")
            )
        )
        self.by_bmm = key_valid.device.type == "cpu" and dtype in (torch.float32, torch.float64)
        self.rope = _RopeTable(self.inner.rotary_emb, capacity, key_valid.device)

    def keep(self, keep: torch.Tensor) -> None:
        """Drop the cache rows where `keep` is False (finished responses), compacting each layer in
        place: the kept rows move to the front of the same storage, so old and new caches never
        coexist (at most one layer's kept rows are copied at a time)."""
        idx = keep.nonzero().squeeze(1)
        for cache in (self.k, self.v):
            for i, t in enumerate(cache):
                t[: len(idx)] = t.index_select(0, idx)
                cache[i] = t[: len(idx)]
        self.key_valid = self.key_valid[keep]
        self.prompt_bias = None if self.prompt_bias is None else self.prompt_bias[keep]
        if self.next_col is not None:
            self.next_col = self.next_col[keep]
            self.length = int(self.next_col.max()) if len(idx) else self.length  # the longest row left
        self.rows = self.rows[keep]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Append one token per cache row (tokens (n,), positions (n,)); return next-token logits (n, V)."""
        t = self.length
        self.length += 1
        ragged, bias = self.next_col is not None, None
        if ragged:  # each row writes at its own column and sees its own keys only
            rows, cols = torch.arange(len(tokens), device=tokens.device), self.next_col
            bias = self._bias(cols[:, None], t + 1)  # (n, 1, t + 1)
            self.next_col = cols + 1
        x = self.inner.embed_tokens(tokens)  # (n, H): one position per row, no sequence axis
        cos, sin = self.rope(x, positions)  # (n, 1, head_dim)
        for i, (layer, fused) in enumerate(zip(self.inner.layers, self.fused)):
            q, k, v = fused.heads(fused.norm(layer.input_layernorm, x), cos, sin)  # (n, heads, d), rotated
            if ragged:
                self.k[i][rows, :, cols] = k
                self.v[i][rows, :, cols] = v
            else:
                self.k[i][:, :, t] = k
                self.v[i][:, :, t] = v
            x = x + layer.self_attn.o_proj(self.attend(i, q, t + 1, layer.self_attn.scaling, bias))
            x = x + fused.mlp(fused.norm(layer.post_attention_layernorm, x))
        return self.model.lm_head(self.inner.norm(x))

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, counts: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Append a block of tokens per cache row: row i's first counts[i] of tokens (n, K), at
        positions[i] on, written from the row's own next column. The rows feeding one token and the
        rows feeding several go through the layers apart (a block costs its width per row). Returns
        the next-token logits after each row's last token (n, V)."""
        start = torch.full_like(counts, self.length) if self.next_col is None else self.next_col
        self.next_col = start + counts
        self.length = int(self.next_col.max())
        if self.length > self.capacity:
            raise ValueError(f"a block past the cache's {self.capacity} columns (the token budget)")
        logits = None
        for group in (counts == 1, counts > 1):
            rows = group.nonzero().squeeze(1)
            if len(rows):
                width = int(counts[rows].max())
                out = self._rows(rows, tokens[rows, :width], counts[rows], start[rows], positions[rows])
                logits = out.new_empty((len(counts), out.shape[1])) if logits is None else logits
                logits[rows] = out
        return logits

    def _rows(self, rows, tokens, counts, start, positions) -> torch.Tensor:
        """Cache rows `rows` each take their first counts of tokens (m, K) from column `start` on (a
        block's unused columns go to the scratch column); their next-token logits (m, V)."""
        m, K = tokens.shape
        offsets = torch.arange(K, device=tokens.device)
        real = offsets[None] < counts[:, None]
        cols = torch.where(real, start[:, None] + offsets[None], self.capacity)
        pos = positions[:, None] + torch.minimum(
            offsets[None], counts[:, None] - 1
        )  # an unused column repeats the last
        x = self.inner.embed_tokens(tokens).reshape(m * K, -1)
        cos, sin = self.rope(x, pos.reshape(-1))
        mask = self._bias(start[:, None] + offsets[None], self.length, rows)[:, None]  # (m, 1, K, length)
        for i, (layer, fused) in enumerate(zip(self.inner.layers, self.fused)):
            q, k, v = fused.heads(fused.norm(layer.input_layernorm, x), cos, sin)
            self.k[i][rows[:, None], :, cols] = k.view(m, K, *k.shape[1:])
            self.v[i][rows[:, None], :, cols] = v.view(m, K, *v.shape[1:])
            q = q.view(m, K, *q.shape[1:]).transpose(1, 2).to(self.k[i].dtype)  # (m, heads, K, d)
            keys, values = self.k[i][rows, :, : self.length], self.v[i][rows, :, : self.length]
            out = F.scaled_dot_product_attention(
                q,
                keys,
                values,
                attn_mask=mask,
                scale=layer.self_attn.scaling,
                enable_gqa=q.shape[1] != keys.shape[1],
            )
            x = x + layer.self_attn.o_proj(out.transpose(1, 2).reshape(m * K, -1))
            x = x + fused.mlp(fused.norm(layer.post_attention_layernorm, x))
        last = x.view(m, K, -1)[torch.arange(m, device=x.device), counts - 1]
        return self.model.lm_head(self.inner.norm(last))

    def _bias(self, query_cols: torch.Tensor, length: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(m, Q, length) additive mask of queries at columns query_cols (m, Q) of cache rows `rows`
        (None: all): a query sees the keys of its row up to its own column, less the prompt's
        left padding."""
        keys = torch.arange(length, device=query_cols.device)
        bias = torch.zeros((*query_cols.shape, length), dtype=self.k[0].dtype, device=query_cols.device)
        bias.masked_fill_(keys[None, None] > query_cols[..., None], float("-inf"))
        if self.prompt_bias is not None:
            bias[..., : self.prompt_bias.shape[2]] += (
                self.prompt_bias if rows is None else self.prompt_bias[rows]
            )
        return bias

    def attend(
        self, i: int, q: torch.Tensor, length: int, scale: float, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention of the new token's queries q (n, heads, d) over layer i's first `length` cached
        positions; (n, heads * d); `bias` (n, 1, length): an additive mask over all of them (else
        the prompt's padding only). Grouped-query heads share their K/V without copies. On the CPU in
        float32/64 as two batched matrix products over the cache's own storage (the live prefix
        of each (row, K/V head), a strided view), a few percent faster than SDPA's CPU
        kernel on a single query when the token loop was timed; elsewhere SDPA's own decode kernels."""
        n, heads, d = q.shape
        keys, values = self.k[i][:, :, :length], self.v[i][:, :, :length]
        kv_heads = keys.shape[1]
        if not self.by_bmm:
            mask = (
                bias[:, None]
                if bias is not None
                else None
                if self.prompt_bias is None
                else torch.cat(
                    [
                        self.prompt_bias,
                        self.prompt_bias.new_zeros((n, 1, length - self.prompt_bias.shape[2])),
                    ],
                    -1,
                )[:, None]
            )
            out = F.scaled_dot_product_attention(
                q[:, :, None].to(keys.dtype),
                keys,
                values,
                attn_mask=mask,
                scale=scale,
                enable_gqa=heads != kv_heads,
            )
            return out.reshape(n, heads * d)
        cap = self.k[i].shape[2]
        keys = self.k[i].view(n * kv_heads, cap, d)[:, :length]
        values = self.v[i].view(n * kv_heads, cap, d)[:, :length]
        scores = torch.bmm(q.reshape(n * kv_heads, heads // kv_heads, d), keys.transpose(1, 2)).mul_(scale)
        if bias is not None:
            scores.view(n, heads, length).add_(bias)
        elif self.prompt_bias is not None:
            scores.view(n, heads, length)[:, :, : self.prompt_bias.shape[2]] += self.prompt_bias
        return torch.bmm(torch.softmax(scores, -1), values).view(n, heads * d)


class _RopeTable:
    """cos/sin of the rotary embedding for a row's position: one table over every position the
    loop can reach (the same elementwise computation as the model's `rotary_emb`, made once),
    looked up per token; RoPE types whose frequencies depend on the sequence length (dynamic,
    longrope) call the model's module at every token instead."""

    def __init__(self, rotary_emb, capacity: int, device):
        self.module = rotary_emb
        kind = str(getattr(rotary_emb, "rope_type", "default"))
        self.cos = self.sin = None
        if "dynamic" not in kind and "longrope" not in kind:
            pos = torch.arange(capacity, device=device)[None]
            # float32, as the module computes them before casting to the hidden states' dtype
            cos, sin = rotary_emb(torch.zeros((1, 1, 1), device=device), pos)  # (1, capacity, d)
            self.cos, self.sin = cos[0], sin[0]

    def __call__(self, x: torch.Tensor, positions: torch.Tensor):
        if self.cos is None:
            return self.module(x[:, None], positions[:, None])
        return self.cos[positions][:, None].to(x.dtype), self.sin[positions][:, None].to(x.dtype)


def compute_dtype(model) -> torch.dtype:
    """The dtype the attention projections produce: autocast's when the caller is in an autocast
    region, else the weights' own. The K/V cache is kept in it (the rotary tables are float32
    under autocast and would otherwise promote the cached keys to float32, twice the memory)."""
    weight = next(model.model.layers[0].self_attn.parameters())
    kind = weight.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else weight.dtype


class _FusedLayer:
    """One decoder layer's projections for the token loop: q/k/v and gate/up each as one matrix
    product over concatenated weights (the same dot products as the separate layers), when the
    projections are plain `nn.Linear`s; otherwise the layer's own modules."""

    def __init__(self, layer, fuse: bool = True):
        attn, mlp = layer.self_attn, layer.mlp
        projs = (attn.q_proj, attn.k_proj, attn.v_proj)
        self.w_qkv, self.b_qkv = _concat(projs) if fuse else (None, None)
        self.split = [p.out_features for p in projs] if self.w_qkv is not None else None
        self.attn = attn
        self.mlp_module = mlp
        self.w_gu, self.b_gu = _concat(_gate_up(mlp)) if fuse else (None, None)

    def qkv(self, h):
        if self.w_qkv is None:
            return self.attn.q_proj(h), self.attn.k_proj(h), self.attn.v_proj(h)
        return F.linear(h, self.w_qkv, self.b_qkv).split(self.split, dim=-1)

    def heads(self, h, cos, sin):
        """q (n, heads, d), k and v (n, kv_heads, d) of the normed hidden states h (n, H), q and k
        rotated by cos/sin (n, 1, d); fused, q and k are rotated as one tensor (the same elementwise
        products: they sit side by side in the fused output)."""
        n, d = h.shape[0], self.attn.head_dim
        if self.w_qkv is None:
            q, k, v = (p.view(n, -1, d) for p in self.qkv(h))
            return _rope(q, cos, sin), _rope(k, cos, sin), v
        out = F.linear(h, self.w_qkv, self.b_qkv)
        nq, nk = self.split[0] // d, self.split[1] // d
        qk = _rope(out[:, : (nq + nk) * d].view(n, nq + nk, d), cos, sin)
        return qk[:, :nq], qk[:, nq:], out[:, (nq + nk) * d :].view(n, nk, d)

    def mlp(self, h):
        if self.w_gu is None:
            return self.mlp_module(h)
        gate, up = F.linear(h, self.w_gu, self.b_gu).chunk(2, dim=-1)
        return self.mlp_module.down_proj(self.mlp_module.act_fn(gate) * up)

    @staticmethod
    def norm(module, x):
        """transformers' RMSNorm (weight * normalise(x in float32) cast back), by torch's fused kernel."""
        eps = getattr(module, "variance_epsilon", None)
        if type(module).__name__ not in _RMS_NORMS or eps is None:
            return module(x)
        h = F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=eps)
        return module.weight * h.to(x.dtype)


_RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm")
_MLPS = ("LlamaMLP", "Qwen2MLP", "MistralMLP")  # down(act(gate(x)) * up(x)), nothing else


def _gate_up(mlp) -> tuple:
    """(gate_proj, up_proj) of an MLP computing down(act(gate(x)) * up(x)) and nothing else; () otherwise."""
    if type(mlp).__name__ not in _MLPS:
        return ()
    return mlp.gate_proj, mlp.up_proj


def _fused_bytes(layers) -> int:
    """Bytes of the q/k/v and gate/up weights of all layers (what fusing would copy)."""
    return sum(
        p.weight.numel() * p.weight.element_size()
        for layer in layers
        for p in (
            layer.self_attn.q_proj,
            layer.self_attn.k_proj,
            layer.self_attn.v_proj,
            *_gate_up(layer.mlp),
        )
        if hasattr(p, "weight")
    )


def _concat(linears):
    """(weight, bias) of plain `nn.Linear`s stacked along their outputs; (None, None) if any is not one."""
    if not linears or any(type(p) is not torch.nn.Linear for p in linears):
        return None, None
    weight = torch.cat([p.weight for p in linears])
    biases = [p.bias for p in linears]
    if all(b is None for b in biases):
        return weight, None
    bias = torch.cat(
        [b if b is not None else p.weight.new_zeros(p.out_features) for p, b in zip(linears, biases)]
    )
    return weight, bias


def _rope(x, cos, sin):
    """transformers' rotary embedding of x (..., d): x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _layer_kv(cache, i):
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return layers[i].keys, layers[i].values
    return cache.key_cache[i], cache.value_cache[i]  # older transformers
