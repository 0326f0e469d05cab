"""FLOPs and parameters: what FlopCounterMode counts on a step (`count_flops`, `flop_report`), with the CPU kernels
it has no formula for mapped (`flop_counter_mode`), FiSH App. D's attention-matrix part counted on a layer and by
the paper, and each family's paper formula for a whole model (`paper_flops`; hf_mgk.flops)."""

import copy

import torch
from torch.utils import flop_counter

from hf_mgk import flops as paper


def paper_flops(kind, config, length, batch, formula="app_b"):
    """(forward FLOPs by the family's paper formula over all layers and the batch, what the formula covers), or
    (None, why not). formula "app_d" (the fish family, GPT-2 and FiSH-GPT2): FiSH App. D, the attention-matrix
    part; otherwise the attention layer: NPRF's products for NPRF, MGK App. B for softmax and MGK attention."""
    if formula == "app_d":
        return app_d(config, batch, length)["appd_flops"], "FiSH App. D, attention-matrix part"
    if kind == "longformer":
        return None, "no formula (Longformer)"
    hidden, heads, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kind_of_attention = getattr(config, "attention_type", "softmax")
    if kind == "nprf_roberta" and kind_of_attention == "nprf":
        per_layer = paper.nprf_attention_flops(length, hidden, heads, head_dim, config.num_random_features)
        return per_layer * layers * batch, "NPRF products, FFT form, attention layer"
    if kind_of_attention not in ("softmax", "mgk"):
        return None, f"no formula ({kind_of_attention}: App. B covers separate keys, option (A))"
    keys = config.num_keys if kind_of_attention == "mgk" else 1
    per_layer = paper.mgk_attention_flops(length, hidden, heads, head_dim, keys)
    return per_layer * layers * batch, "MGK App. B, attention layer"


# ------------------------------------------------------------------ FLOP counting
def _cpu_sdpa_flops(query, key, value, dropout_p=0.0, is_causal=False, *args, out_shape=None, **kwargs):
    """FlopCounterMode has no formula for the CPU flash kernel (it would count 0): PyTorch's own SDPA count
    (QK^T and PV, 2mnk each), on the visible pairs only when causal (row i sees keys j <= i, top-left),
    as the kernel skips key blocks wholly above the diagonal and FiSH's blocked path cuts them off."""
    return _causal_share(flop_counter.sdpa_flop_count(query, key, value), query[-2], key[-2], is_causal)


def _cpu_sdpa_backward_flops(grad_out, query, key, value, out, logsumexp, dropout_p=0.0, is_causal=False,
                             *args, out_shape=None, **kwargs):
    full = flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)
    return _causal_share(full, query[-2], key[-2], is_causal)


def _causal_share(full, n, s, is_causal):
    """`full` (a count over all n x s pairs, a multiple of n*s) times the visible share of the pairs."""
    if not is_causal:
        return full
    visible = sum(min(i + 1, s) for i in range(n))
    return full // (n * s) * visible


def flop_counter_mode():
    """FlopCounterMode with the CPU flash kernel's counts, and in-place baddbmm_ counted as baddbmm (PyTorch has no
    formula for it and would count 0: the blocked MGK and FiSH backwards accumulate their gradients with it)."""
    aten = torch.ops.aten
    return flop_counter.FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
        aten.baddbmm_: _baddbmm_flops,
    })


def _baddbmm_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs):
    """2 b m n k for the product of (b, m, k) and (b, k, n), as PyTorch counts baddbmm (the add is not counted)."""
    b, m, k = a_shape
    return 2 * b * m * k * b_shape[-1]


def _total(counts):
    return int(sum(counts.values()))


def count_flops(model, ids, step=None, attention="attn"):
    """FlopCounterMode counts (2mnk per matmul) of one step on the model as it is (training: grad enabled, so the
    attention takes its training path; or a no-grad forward): the forward of the whole model, the share of the
    modules named `attention` in that forward (taken before the backward, whose module attribution is not
    reliable), and the whole step (flops_fwd_bwd; the forward alone for a forward step). `step(on_forward)` runs
    one step and calls on_forward() after the forward; by default a forward, the benchmark's loss and a backward
    (gradients cleared after)."""
    if step is None:
        def step(on_forward):
            hidden = model(ids).last_hidden_state
            on_forward()
            hidden.float().pow(2).mean().backward()
            model.zero_grad(set_to_none=True)
    forward = {}
    with flop_counter_mode() as fc:
        step(lambda: forward.update(fc.get_flop_counts()))
    attn = sum(_total(c) for name, c in forward.items() if name.split(".")[-1] == attention)
    return {"flops_fwd": _total(forward["Global"]), "flops_attn": attn, "flops_fwd_bwd": fc.get_total_flops()}


# ------------------------------------------------------------------ FiSH App. D: the attention-matrix part
def attention_matrix_flops(attn, batch, length):
    """FlopCounterMode count of App. D's part of one attention layer (`attn`: GPT-2's or FiSH-GPT2's): the
    Q/K projections (bias-free count: addmm counts the product only) and the attention matrices before the
    softmax (QK^T; for FiSH the M global QK^T and the package's own mixing, noise included in training).
    Values, softmax and the output projection are left out, as in App. D; no mask, full N x N, as App. D.
    Run on meta tensors: shapes only, no work."""
    from hf_mgk.attention_fish import fish_attention

    attn = copy.deepcopy(attn).to("meta")
    qk_heads = getattr(attn, "num_qk_heads", attn.num_heads)
    width = qk_heads * attn.head_dim
    d = attn.c_attn.weight.shape[0]
    x = torch.empty(batch * length, d, device="meta")
    with torch.no_grad(), flop_counter_mode() as fc:
        qk = torch.addmm(attn.c_attn.bias[:2 * width], x, attn.c_attn.weight[:, :2 * width])
        q, k = qk.view(batch, length, 2, qk_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        if hasattr(attn, "mixing"):  # value heads of size 0: the product with V counts nothing
            value = torch.empty(batch, attn.num_heads, length, 0, device="meta")
            noise = getattr(attn, "noise_std", None) if attn.training else None
            fish_attention(q, k, value, attn.mixing, scale=attn.scaling, noise_std=noise, return_weights=True)
        else:
            torch.matmul(q, k.transpose(-1, -2))
    return fc.get_total_flops()


def attention_matrix_params(attn):
    """App. D's parameters of one layer, counted on the module: the Q/K projection weights (no bias, as App. D),
    the mixing weights p_kj (or GFiSH's network) and sigma_k."""
    width = getattr(attn, "num_qk_heads", attn.num_heads) * attn.head_dim
    n = attn.c_attn.weight[:, :2 * width].numel()
    if hasattr(attn, "mixing"):
        n += sum(p.numel() for p in ([attn.mixing] if isinstance(attn.mixing, torch.nn.Parameter)
                                     else attn.mixing.parameters()))
    if hasattr(attn, "noise_std"):
        n += attn.noise_std.numel()
    return n


def app_d(config, batch, length):
    """App. D (hf_mgk.flops.fish_cost) for the whole model: per layer x layers x batch."""
    fish_cost = paper.fish_cost

    kind = getattr(config, "attention_type", "softmax")
    head_dim = getattr(config, "head_dim", None) or config.n_embd // config.n_head
    m = getattr(config, "num_global_heads", 1)
    cost = fish_cost(config.n_embd, config.n_head, m, head_dim, length,
                     variant="fish" if kind == "softmax" else kind)
    flops, params = (("mha_flops", "mha_params") if kind == "softmax" else ("fish_flops", "fish_params"))
    return {"appd_flops": cost[flops] * config.n_layer * batch, "appd_params": cost[params] * config.n_layer}


def flop_report(model, ids, step=None):
    """count_flops (of `step`, see there), plus the attention-matrix part counted and by App. D (all layers)."""
    batch, length = ids.shape
    layers = model.h
    result = count_flops(model, ids, step)
    result["flops_score"] = sum(attention_matrix_flops(block.attn, batch, length) for block in layers)
    result["params_score"] = sum(attention_matrix_params(block.attn) for block in layers)
    result["params_attn"] = sum(p.numel() for block in layers for p in block.attn.parameters())
    result.update(app_d(model.config, batch, length))
    return result
