"""The papers' measurements of attention heads, as functions on attention matrices.

- `attention_ranks`: the rank of each attention matrix (Nguyen et al., "Improving Transformers with
  Probabilistic Attention Keys", ICML 2022, Sec. 4 and Figs. 2, 7: SVD, singular values below 1e-6 dropped);
- `head_distances`: mean and variance of the squared L2 distances between the heads of one layer
  (Nguyen et al., "Improving Transformer with an Admixture of Attention Heads" (FiSH), Sec. 5.2, Table 7);
- `principal_components`: how many eigenvalues of the uncentred covariance of the vectorised attention matrices
  of one layer explain a share of their sum (FiSH paper, Sec. 5.3, Eq. 13, Table 8);
- `collect_attentions`: the per-layer attention matrices of any model that returns `output_attentions`, in
  batches, with padding cut away.

A layer's attentions are given as a tensor (S, H, N, N) of S sequences of equal length, or as a list of S
tensors (H, n_s, n_s) (what `collect_attentions` returns per layer, lengths may differ). All numbers are
computed in float64 whatever the input's dtype. Plotting lives in `scripts/analyze_heads.py`."""

import torch

# Matrices per float64 SVD / sequences per distance block: bounds the float64 copies, not the result.
_CHUNK = 256


def _items(attn, name):
    """A layer's attentions as a list of tensors (H, n, n) or one stacked tensor; validated."""
    if isinstance(attn, torch.Tensor):
        if attn.dim() < 2 or attn.shape[-1] != attn.shape[-2]:
            raise ValueError(f"{name} needs square attention matrices (..., N, N); got shape {tuple(attn.shape)}")
        if attn.numel() == 0:
            raise ValueError(f"{name} got no attention matrices (shape {tuple(attn.shape)})")
        return attn
    attn = list(attn)
    if not attn:
        raise ValueError(f"{name} got no attention matrices")
    heads = {tuple(a.shape[:-2]) for a in attn}
    if len(heads) > 1 or any(a.dim() != 3 or a.shape[-1] != a.shape[-2] for a in attn):
        raise ValueError(f"{name} needs a list of (H, n, n) tensors with the same H (one layer's sequences); "
                         f"got shapes {sorted({tuple(a.shape) for a in attn})}")
    if len({a.shape[-1] for a in attn}) == 1:
        return torch.stack(attn)
    return attn


def attention_ranks(attn, tol=1e-6):
    """The rank of each attention matrix: the number of its singular values above `tol`.

    `tol` is absolute, as in the MGK paper (singular values below 1e-6 are thresholded); an attention matrix's
    rows sum to 1, so its largest singular value lies in [1, sqrt(N)] and an absolute threshold means the
    same for every matrix. The SVD runs in float64 whatever the input dtype (float16 / bfloat16 / float32
    round-off alone would give spurious singular values above 1e-6).

    attn: (..., N, N), or a list of S tensors (H, n_s, n_s). Returns a long tensor of shape attn.shape[:-2]
    ((S, H) for a list)."""
    if tol < 0:
        raise ValueError(f"tol must be >= 0; got {tol}")
    attn = _items(attn, "attention_ranks")
    if isinstance(attn, list):
        return torch.stack([attention_ranks(a, tol) for a in attn])
    flat = attn.reshape(-1, *attn.shape[-2:])
    ranks = [(torch.linalg.svdvals(chunk.detach().to("cpu", torch.float64)) > tol).sum(-1)
             for chunk in flat.split(_CHUNK)]
    return torch.cat(ranks).reshape(attn.shape[:-2])


def _pair_distances(attn):
    """(S, H(H-1)/2) squared distances ||A_s^h - A_s^h'||^2 of the vectorised heads, pairs h < h' in order."""
    s, h = attn.shape[:2]
    out = []
    for chunk in attn.reshape(s, h, -1).split(max(1, _CHUNK // h)):
        x = chunk.detach().to("cpu", torch.float64)
        # Differences, not |a|^2 + |b|^2 - 2ab: identical heads give exactly 0.
        out.append(torch.cat([(x[:, i + 1:] - x[:, i:i + 1]).square().sum(-1) for i in range(h - 1)], dim=1))
    return torch.cat(out)


def head_distances(attn):
    """Mean and variance of the squared L2 distances ||A_s^h - A_s^h'||_2^2 between the vectorised attention
    matrices of every head pair h < h' of every sequence s of one layer.

    The mean is the FiSH paper's d^l = 2 / (S H (H-1)) sum_s sum_{h<h'} ||A_s^h - A_s^h'||^2 (Sec. 5.2); the
    variance is the population variance of the same S H (H-1) / 2 numbers (the paper's Table 7 reports both,
    averaged over layers). attn: (S, H, N, N), or a list of S tensors (H, n_s, n_s). Returns (mean, variance)
    as floats."""
    attn = _items(attn, "head_distances")
    if isinstance(attn, torch.Tensor) and attn.dim() != 4:
        raise ValueError(f"head_distances needs one layer's attentions (S, H, N, N); got shape {tuple(attn.shape)}")
    heads = attn[0].shape[0]
    if heads < 2:
        raise ValueError(f"head_distances needs at least 2 heads; got {heads}")
    parts = [_pair_distances(a[None]) for a in attn] if isinstance(attn, list) else [_pair_distances(attn)]
    d = torch.cat([p.flatten() for p in parts])
    return d.mean().item(), d.var(correction=0).item()


def attention_spectrum(attn):
    """The eigenvalues, in descending order, of the FiSH paper's Eq. 13 matrix
    C = 1/(S H) sum_s sum_h vec(A_s^h) vec(A_s^h)^T  (N^2 x N^2, uncentred, as written there).

    C = X^T X / (S H) with X the (S H, N^2) matrix of vectorised attentions; its nonzero eigenvalues are those of
    the (S H) x (S H) Gram matrix X X^T / (S H), so the smaller of the two is decomposed. Returns a float64 tensor
    of min(S H, N^2) eigenvalues (the others are 0). attn: (S, H, N, N), or a list of (H, n, n) of one length n
    (vectors of different lengths do not share a space)."""
    attn = _items(attn, "attention_spectrum")
    if isinstance(attn, list):
        raise ValueError("the principal components need sequences of one length (vectorised N x N matrices of "
                         f"one N); got lengths {sorted({a.shape[-1] for a in attn})}: cut the text into blocks of "
                         "equal length")
    if attn.dim() != 4:
        raise ValueError(f"attention_spectrum needs one layer's attentions (S, H, N, N); got {tuple(attn.shape)}")
    x = attn.detach().reshape(-1, attn.shape[-1] ** 2).cpu()
    rows, dim = x.shape
    blocks = x.split(_CHUNK * 4)
    if rows <= dim:  # Gram matrix, built blockwise so only one float64 block pair exists at a time
        gram = torch.cat([torch.cat([a.double() @ b.double().T for b in blocks], dim=1) for a in blocks])
    else:
        gram = sum(b.double().T @ b.double() for b in blocks)
    eig = torch.linalg.eigvalsh(gram / rows)
    return eig.flip(0).clamp_min(0.0)  # round-off can make zero eigenvalues slightly negative


def explained_components(eigenvalues, variance=0.95):
    """The number of leading eigenvalues (descending order) whose sum is at least `variance` of the total."""
    if not 0 < variance <= 1:
        raise ValueError(f"variance must be a share in (0, 1]; got {variance}")
    eig = torch.as_tensor(eigenvalues, dtype=torch.float64)
    total = eig.sum()
    if not total > 0:
        raise ValueError("all eigenvalues are zero: the attention matrices are all zero")
    share = eig.cumsum(0) / total
    # A relative slack of 1e-12 so that variance=1 (or an exact share) is not missed by round-off in the sum.
    return min(int((share < variance - 1e-12).sum()) + 1, eig.numel())


def principal_components(attn, variance=0.95):
    """The number of principal components that explain `variance` of the FiSH paper's Eq. 13 covariance of one
    layer's vectorised attention matrices (Table 8: 95%): the smallest k whose k leading eigenvalues sum to at
    least `variance` times the sum of all. attn: (S, H, N, N), or a list of (H, n, n) of one length."""
    if not 0 < variance <= 1:
        raise ValueError(f"variance must be a share in (0, 1]; got {variance}")
    return explained_components(attention_spectrum(attn), variance)


@torch.no_grad()
def collect_attentions(model, input_ids, attention_mask=None, batch_size=8, progress=False):
    """Every layer's attention matrices of `model` (any hf-mgk family, its softmax baseline, or a stock HF model
    loaded with attn_implementation="eager"), through `output_attentions=True`, with padding cut away.

    input_ids, attention_mask: (B, N) tensors (1 = real token, 0 = padding, left or right). Each row's real
    tokens are moved to its front before the model runs, and a batch is cut to its longest row: absolute
    positions then start at 0 as when the sequence runs alone (BERT and GPT-2 count positions from the first
    column, so left padding would shift them). The model runs in eval mode (no dropout, no FiSH noise) and
    without gradients, `batch_size` sequences at a time; its mode is restored afterwards. progress: a tqdm bar
    over batches (a string names it).

    Returns a list over layers of lists over sequences: out[l][s] is a float32 CPU tensor (H, n_s, n_s), the
    attention among the n_s real tokens of sequence s in layer l (rows: queries, columns: keys), exactly what
    the model gives for that sequence run alone. Each out[l] is what the other functions take."""
    if input_ids.dim() != 2 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids must be a non-empty (batch, sequence_length) tensor; got {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids {tuple(input_ids.shape)}")
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError("attention_mask must hold 1 for real tokens and 0 for padding")
    if not bool(attention_mask.bool().any(-1).all()):
        raise ValueError("a sequence has no real token (its attention_mask row is all 0)")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    device = next(model.parameters()).device
    starts = range(0, input_ids.shape[0], batch_size)
    if progress:
        from tqdm.auto import tqdm  # a dependency of transformers

        starts = tqdm(starts, desc=progress if isinstance(progress, str) else "attentions", unit="batch")
    was_training = model.training
    model.eval()
    layers = None
    try:
        for start in starts:
            mask = attention_mask[start:start + batch_size]
            # A stable sort of (1 - mask) puts the real tokens first, in their order.
            order = torch.argsort(1 - mask.long(), dim=-1, stable=True)[:, :int(mask.sum(-1).max())]
            ids, mask = input_ids[start:start + batch_size].gather(1, order), mask.gather(1, order)
            out = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_attentions=True)
            attentions = getattr(out, "attentions", None)
            if not attentions or any(a is None for a in attentions):
                raise ValueError(
                    f"{type(model).__name__} returned no attention matrices with output_attentions=True; a stock "
                    "transformers model must be loaded with attn_implementation='eager' (or call "
                    "model.set_attn_implementation('eager'))")
            if layers is None:
                layers = [[] for _ in attentions]
            for row, n in enumerate(mask.sum(-1).tolist()):
                for layer, a in zip(layers, attentions):
                    layer.append(a[row, :, :n, :n].float().cpu())
    finally:
        model.train(was_training)
    return layers
