"""Configuration of RoBERTa with normalized positive random features and relative positions.

NPRF + RPE: Luo et al., "Stable, Fast and Accurate: Kernelized Attention with Relative Positional Encoding"
(NeurIPS 2021, arXiv:2106.12566). The fixed head size `head_dim`: Bhojanapalli et al., "Low-Rank Bottleneck in
Multi-head Attention Models" (ICML 2020, arXiv:2002.07028)."""

from transformers.models.roberta.configuration_roberta import RobertaConfig

from .config_checks import ValidatedConfig, check_backend, check_bool, check_choice, check_head_dim, check_int_range
from .transformers_compat import ConfigCompat

# The `backend` field's names: nprf_attention's `backend` argument.
NPRF_BACKENDS = ("explicit", "fft", "band")


class NPRFRobertaConfig(ValidatedConfig, ConfigCompat, RobertaConfig):
    r"""Every [`RobertaConfig`] field, plus:

    attention_type (`str`, defaults to `"nprf"`): `"softmax"` (stock RoBERTa attention, the baseline) or `"nprf"`
        (kernelized attention with positive random features, Luo et al. 2021).
    normalize_qk (`bool`, defaults to True): unit-norm queries and keys per head (NPRF). False is the paper's
        unnormalised PRF ablation, which can diverge: the features then take q / D^(1/4) and k / D^(1/4), so that
        they estimate the softmax kernel exp(q.k / sqrt(D)) as in Performer.
    use_rpe (`bool`, defaults to True): the learned relative-position bias b_{j-i} (per head, shared by all layers,
        T5 buckets). False is the no-RPE ablation.
    num_random_features (`int`, defaults to 64): m, rows of the feature matrix W.
    rpe_num_buckets (`int`, defaults to 32), rpe_max_distance (`int`, defaults to 128): T5 bucketing of j - i.
    feature_redraw_interval (`int`, defaults to 0): in training, draw a new W every this many forward passes of a
        layer (0 = never). Evaluation never redraws. W and the count of training forwards are persistent buffers: a
        reloaded model gives the same outputs, and a resumed run redraws at the same steps.
    random_feature_seed (`int`, defaults to 0): seed of W. Layer l's draw d comes from its own generator seeded by
        (seed, l, d) (see `feature_generator`): every layer has its own W, and the global RNG is left alone.
    use_absolute_positions (`bool`, defaults to True): RoBERTa's learned position embeddings. False removes them, so
        any length is accepted (positions come from the RPE alone).
    head_dim (`int`, *optional*): fixed head size; `None` = hidden_size / num_attention_heads.
    backend (`str`, defaults to `"auto"`): which exact path computes NPRF attention. `"auto"` picks per call;
        `"explicit"` (the N x S matrix), `"fft"` or `"band"` force one (a call it cannot run is an error naming
        why). Every path computes the same function.
    """

    model_type = "nprf-roberta"
    _stock_model_type = "roberta"  # its checkpoints convert (the warm start); see config_checks

    attention_type: str = "nprf"
    normalize_qk: bool = True
    use_rpe: bool = True
    num_random_features: int = 64
    rpe_num_buckets: int = 32
    rpe_max_distance: int = 128
    feature_redraw_interval: int = 0
    random_feature_seed: int = 0
    use_absolute_positions: bool = True
    head_dim: int | None = None
    backend: str = "auto"

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.check_fields()

    def check_fields(self):
        check_choice("attention_type", self.attention_type, ("softmax", "nprf"))
        check_backend(self.backend, self.attention_type, {"nprf": NPRF_BACKENDS})
        self.check_inherited_fields()
        check_bool("normalize_qk", self.normalize_qk)
        check_bool("use_rpe", self.use_rpe)
        check_bool("use_absolute_positions", self.use_absolute_positions)
        check_int_range("num_random_features", self.num_random_features, 1)
        check_int_range("rpe_num_buckets", self.rpe_num_buckets, 4)
        # T5 buckets: half of each direction's buckets are exact offsets; the log range must start past them.
        exact = self.rpe_num_buckets // (2 if not self.is_decoder else 1) // 2
        check_int_range("rpe_max_distance", self.rpe_max_distance, exact + 1)
        check_int_range("feature_redraw_interval", self.feature_redraw_interval, 0)
        check_int_range("random_feature_seed", self.random_feature_seed, 0)
        check_head_dim(self.hidden_size, self.num_attention_heads, self.head_dim)
        check_int_range("max_position_embeddings", self.max_position_embeddings, 1)

    @property
    def attention_head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads


__all__ = ["NPRFRobertaConfig"]
