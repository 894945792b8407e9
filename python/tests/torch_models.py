"""Small torch models shared by the package's tests (imported by them; torch required)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def rotate(x, base=10000.0):
    """Llama's rotary embedding of [B, H, N, P] (rotate_half convention), a function as in Hugging Face code."""
    n, p = x.shape[-2:]
    angles = torch.arange(n, dtype=torch.float32)[:, None] * base ** (-torch.arange(0, p, 2).float() / p)[None]
    cos, sin = torch.cat((angles.cos(),) * 2, -1), torch.cat((angles.sin(),) * 2, -1)
    half = torch.cat((-x[..., p // 2:], x[..., : p // 2]), -1)
    return x * cos + half * sin


class LlamaAttention(nn.Module):
    """Causal grouped-query attention: q_proj/k_proj/v_proj, RoPE as a function, repeat_kv, SDPA, o_proj.
    q_rot/k_rot are identity modules after RoPE: the hook points of capture with LayerSpec (their outputs are
    what attention multiplies); q_proj/k_proj outputs are not (RoPE comes after them)."""

    def __init__(self, d_model=48, heads=4, kv_heads=2, head_dim=12):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(d_model, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, kv_heads * head_dim, bias=False)
        self.q_rot, self.k_rot = nn.Identity(), nn.Identity()
        self.o_proj = nn.Linear(heads * head_dim, d_model, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        split = lambda t, h: t.view(b, n, h, self.head_dim).transpose(1, 2)  # noqa: E731
        q = self.q_rot(rotate(split(self.q_proj(x), self.heads)))
        k = self.k_rot(rotate(split(self.k_proj(x), self.kv_heads)))
        v = split(self.v_proj(x), self.kv_heads)
        r = self.heads // self.kv_heads
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)  # Llama's repeat_kv
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(context.transpose(1, 2).reshape(b, n, -1))


class Llama(nn.Module):
    def __init__(self, layers=2, vocab=50, d_model=48):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(LlamaAttention(d_model) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(layers))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for norm, attention in zip(self.norms, self.layers):
            x = x + attention(norm(x))
        return self.head(x)


def llama_and_tokens(seed=0, batch=2, n=40):
    torch.manual_seed(seed)
    model = Llama().eval()
    return model, torch.randint(0, 50, (batch, n))
