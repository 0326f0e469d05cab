"""hf_mgk.flops: the papers' formulas as written, and how each relates to what torch.utils.flop_counter counts on
the package's own layers (FlopCounterMode: 2 m n k per product, nothing elementwise; App. B: m n (2k - 1)).

Each relation is stated and asserted exactly on tiny configurations, forward, no padding:
- softmax (App. B (i)): counted = formula + one addition per product entry (3 N H D + N^2 H + N H D + N D_x);
- MGK (App. B (ii)), blocked path: counted = formula + h N^2 (4M + 1) + h N D (M + 3) + N D_x: the same one
  addition per entry, plus the path's two augmented columns per key (-|k|^2/2 sigma^2 and log pi: 2 x 2 per pair
  and key) that App. B counts as "similar to a dot product";
- NPRF: the explicit path counts exactly the "explicit" form; on the FFT path FlopCounterMode counts the feature
  maps only (FFTs and the channel products are not matrix products), i.e. the formula's linear part.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from hf_mgk import flops
from hf_mgk import attention_nprf as an
from hf_mgk.flops import fish_cost

N, DX = 12, 32


def _counted(module, *args, **kwargs):
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        module(*args, **kwargs)
    return fc.get_total_flops()


def _bert_attention(kind, heads, head_dim, **extra):
    from transformers import BertConfig, BertModel

    from hf_mgk import MGKBertConfig, MGKBertModel

    size = dict(hidden_size=DX, num_hidden_layers=1, intermediate_size=64, vocab_size=50,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_attention_heads=heads)
    config = BertConfig(**size) if kind == "bert" else MGKBertConfig(**size, head_dim=head_dim, **extra)
    # eager: plain matmuls, every product visible to FlopCounterMode (it has no formula for CPU flash SDPA)
    config._attn_implementation = "eager"
    model = (BertModel if kind == "bert" else MGKBertModel)(config, add_pooling_layer=False)
    return model.eval().encoder.layer[0].attention


def test_app_b_closed_forms():
    """The general-D_x code equals App. B's printed closed forms at D_x = H D."""
    for n, h, d in [(12, 4, 8), (512, 8, 64), (1000, 12, 64)]:
        dx = h * d
        assert flops.mgk_attention_flops(n, dx, h, d) == n * n * h * (4 * d - 1) + n * h * d * (6 * dx + 2 * h * d - 5)
        # (ii) with M = 2 and H/2 heads, printed: N^2 H (3D - 0.5) + N H D (4 D_x + H D - 4) (doubled: integers);
        # the code follows the line before it, N H D (M - 1) / M = N H D / 2 higher (see mgk_attention_flops)
        assert 2 * flops.mgk_attention_flops(n, dx, h // 2, d, num_keys=2) == (
            n * n * h * (6 * d - 1) + 2 * n * h * d * (4 * dx + h * d - 4)) + n * h * d
        saved = flops.mgk_attention_flops(n, dx, h, d) - flops.mgk_attention_flops(n, dx, h // 2, d, num_keys=2)
        # App. B's saving N^2 H (D - 0.5) + N H D (2 D_x + H D - 1), less the same N H D / 2
        assert 2 * saved == 2 * n * n * h * d - n * n * h + 2 * n * h * d * (2 * dx + h * d - 1) - n * h * d
        for m in (2, 3, 4):  # the general line, N H D (M - 1) / M above the general closed form (times M)
            hm = 12 // m
            line = m * flops.mgk_attention_flops(n, 12 * d, hm, d, num_keys=m)
            closed = n * n * 12 * (2 * (m + 1) * d - 1) + n * 12 * d * (2 * (m + 2) * 12 * d + 2 * 12 * d - (3 * m + 2))
            assert line - closed == n * 12 * d * (m - 1)
        assert flops.mgk_attention_params(dx, h, d) == 3 * h * d * dx + (h * d) ** 2
        assert 2 * flops.mgk_attention_params(dx, h // 2, d, 2) == 2 * (2 * h * d * dx + h) + (h * d) ** 2


@pytest.mark.parametrize("heads, head_dim", [(4, 8), (2, 8), (4, 4)])  # the last: fixed head size, H D != D_x
def test_softmax_formula_against_counted(heads, head_dim):
    if heads * head_dim == DX:
        attn = _bert_attention("bert", heads, head_dim)
    else:
        attn = _bert_attention("mgk", heads, head_dim, attention_type="softmax")
    counted = _counted(attn, torch.randn(1, N, DX))
    h, d = heads, head_dim
    entries = 3 * N * h * d + N * N * h + N * h * d + N * DX
    assert counted == flops.mgk_attention_flops(N, DX, h, d) + entries


@pytest.mark.parametrize("num_keys", [2, 3])
def test_mgk_formula_against_counted_blocked_path(num_keys):
    h, d, m = 2, 8, num_keys
    attn = _bert_attention("mgk", h, d, num_keys=m, mgk_variances=[1.0 + 2 * r for r in range(m)])
    counted = _counted(attn, torch.randn(1, N, DX))
    formula = flops.mgk_attention_flops(N, DX, h, d, num_keys=m)
    assert counted == formula + h * N * N * (4 * m + 1) + h * N * d * (m + 3) + N * DX


@pytest.mark.parametrize("num_keys", [1, 2, 3])
def test_params_formula_is_the_weight_matrices(num_keys):
    """App. B.2 counts weights without biases: the layer's 2-D parameters, which are the Q/K/V/output matrices
    and (MGK, learned prior) the (h, M) prior logits."""
    if num_keys == 1:
        attn = _bert_attention("bert", 2, DX // 2)
        h, d = 2, DX // 2
    else:
        attn = _bert_attention("mgk", 2, 8, num_keys=num_keys, mgk_prior="learned",
                               mgk_variances=[1.0 + 2 * r for r in range(num_keys)])
        h, d = 2, 8
    two_d = sum(p.numel() for p in attn.parameters() if p.dim() == 2)
    assert flops.mgk_attention_params(DX, h, d, num_keys) == two_d


def _nprf_inputs(h=2, n=N, d=8, m=4):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, d, generator=g) for _ in range(3))
    bias = torch.randn(h, 2 * n - 1, generator=g)
    return q, k, v, bias, an.draw_features(m, d, g)


@pytest.mark.parametrize("path", ["explicit", "fft"])
def test_nprf_formula_against_counted(path):
    h, d, m = 2, 8, 4
    q, k, v, bias, w = _nprf_inputs(h, N, d, m)
    counted = _counted(an.nprf_attention, q, k, v, bias, w, backend=path)
    projections = 4 * 2 * N * DX * h * d
    formula = flops.nprf_attention_flops(N, DX, h, d, m, toeplitz=path)
    if path == "explicit":
        assert counted == formula - projections
    else:
        assert counted == h * 2 * 2 * N * d * m  # the feature maps: the FFT part is not a matrix product
        assert formula - projections - counted == h * round(
            m * (d + 1) * (5 * 2 * N * torch.log2(torch.tensor(2.0 * N)).item() + 6 * (N + 1)) + 3 * N * m * (d + 1))


def test_nprf_fft_form_grows_as_n_log_n():
    """The paper's claim in numbers: the explicit form's Toeplitz part quadruples per doubling of N, the FFT form's
    grows by 2 (1 + 1/log2 L); the FFT form is the cheaper one from a few thousand tokens at m = 32, D = 64."""
    args = (512, 8, 64, 32)

    explicit = [flops.nprf_attention_flops(n, *args, toeplitz="explicit") for n in (4096, 8192)]
    fft = [flops.nprf_attention_flops(n, *args, toeplitz="fft") for n in (4096, 8192)]
    assert 3.3 < explicit[1] / explicit[0] < 4 and 2 < fft[1] / fft[0] < 2.3
    assert flops.nprf_attention_flops(16384, *args, toeplitz="fft") < flops.nprf_attention_flops(
        16384, *args, toeplitz="explicit")
    with pytest.raises(ValueError, match="toeplitz"):
        flops.nprf_attention_flops(8, *args, toeplitz="band")


def test_fish_cost_is_the_attention_module_function():
    assert flops.fish_cost is fish_cost
    assert flops.fish_cost(512, 8, 2, 64, 1024)["fish_flops"] < flops.fish_cost(512, 8, 2, 64, 1024)["mha_flops"]
