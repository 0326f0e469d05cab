"""Every configuration refuses values of the wrong kind with a ValueError naming the field, in the field's own
name (GPT-2: n_embd / n_head / n_positions; BERT and RoBERTa: hidden_size / num_attention_heads /
max_position_embeddings)."""

import pytest

from hf_mgk import FiSHGPT2Config, MGKBertConfig, MGKGPT2Config, NPRFRobertaConfig
from hf_mgk.modeling_common import check_sequence_length
import tiny

GPT2 = tiny.gpt2()
ENCODER = tiny.roberta()  # MGK-BERT's and NPRF-RoBERTa's


@pytest.mark.parametrize("kw,field", [
    (dict(fish_noise_init=True), "fish_noise_init"),  # a bool is not a number here
    (dict(fish_noise_init=float("nan")), "fish_noise_init"),
    (dict(n_embd=0), "n_embd"), (dict(n_embd=-32), "n_embd"),
    (dict(n_head=0), "n_head"),
    (dict(n_positions=0), "n_positions"),
    (dict(n_head=5), r"n_embd \(32\) is not a multiple of n_head \(5\)"),
])
def test_fish_gpt2_config(kw, field):
    with pytest.raises(ValueError, match=field):
        FiSHGPT2Config(**{**GPT2, **kw})


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), -0.5])
def test_fish_noise_init_must_be_finite(value):
    """inf passed `0 <= x <= inf` before: every float field is finite and in range."""
    with pytest.raises(ValueError, match=r"fish_noise_init must be a finite number in \[0, inf\)"):
        FiSHGPT2Config(**{**GPT2, "fish_noise_init": value})


# The stock configs' float fields (dropouts, initializer range, layer-norm epsilon): NaN / inf / out of range named.
GPT2_FLOATS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "initializer_range",
               "layer_norm_epsilon")
ENCODER_FLOATS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "initializer_range",
                  "layer_norm_eps")


@pytest.mark.parametrize("config_cls, base, fields", [
    (FiSHGPT2Config, GPT2, GPT2_FLOATS), (MGKGPT2Config, GPT2, GPT2_FLOATS),
    (MGKBertConfig, ENCODER, ENCODER_FLOATS), (NPRFRobertaConfig, ENCODER, ENCODER_FLOATS)])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 2.0])
def test_inherited_float_fields_are_checked(config_cls, base, fields, value):
    for field in fields:
        if value == 2.0 and field in ("initializer_range", "layer_norm_eps", "layer_norm_epsilon"):
            continue  # no upper bound for a scale
        with pytest.raises(ValueError, match=f"{field} must be a finite number"):
            config_cls(**{**base, field: value})
    # in range passes, and classifier_dropout None still means "use hidden_dropout_prob"
    made = config_cls(**{**base, fields[0]: 0.0, fields[-1]: 1e-6})
    assert getattr(made, fields[0]) == 0.0
    if "classifier_dropout" in fields:
        assert config_cls(**base, classifier_dropout=None).classifier_dropout is None


def test_a_field_set_after_construction_is_checked_before_saving(tmp_path):
    config = MGKBertConfig(**ENCODER)
    config.hidden_dropout_prob = float("nan")
    with pytest.raises(ValueError, match="hidden_dropout_prob"):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("config_cls", [MGKBertConfig, NPRFRobertaConfig])
@pytest.mark.parametrize("kw,field", [
    (dict(hidden_size=0), "hidden_size"), (dict(max_position_embeddings=0), "max_position_embeddings"),
    (dict(max_position_embeddings=-1), "max_position_embeddings"), (dict(num_attention_heads=0), "num_attention_heads"),
    (dict(num_attention_heads=5), r"hidden_size \(32\) is not a multiple of num_attention_heads \(5\)"),
])
def test_encoder_configs(config_cls, kw, field):
    with pytest.raises(ValueError, match=field):
        config_cls(**{**ENCODER, **kw})


@pytest.mark.parametrize("field", ["normalize_qk", "use_rpe", "use_absolute_positions"])
@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_nprf_roberta_flags_must_be_bools(field, value):
    with pytest.raises(ValueError, match=field):
        NPRFRobertaConfig(**{**ENCODER, field: value})


def test_valid_values_pass():
    assert FiSHGPT2Config(**GPT2, fish_noise_init=0).fish_noise_init == 0
    assert NPRFRobertaConfig(**ENCODER, normalize_qk=False, use_rpe=False).use_rpe is False
    MGKBertConfig(**ENCODER)


def test_sequence_length_error_names_the_field_and_explains_the_limit():
    with pytest.raises(ValueError, match="n_positions=64"):
        check_sequence_length(65, 64, "n_positions")
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        check_sequence_length(65, 64)
    # RoBERTa: the usable length is the table size minus the padding offset; say both
    with pytest.raises(ValueError, match=r"at most 64 tokens \(max_position_embeddings=66 minus RoBERTa's padding"):
        check_sequence_length(65, 64, why="max_position_embeddings=66 minus RoBERTa's padding offset 2")
    check_sequence_length(64, 64)


# ------------------------------------------------------------------ every path that makes a config checks it
# A valid saved folder, then one bad field given through each path: the direct constructor, the config's and
# AutoConfig's from_pretrained keywords, the model's (and AutoModel's) from_pretrained keywords, and a hand-edited
# config.json. Before, the keyword paths only *set* the attribute: mgk_prior="bogus" loaded and ran uniform,
# num_global_heads=0 was a ZeroDivisionError, attention_type="foo" an AttributeError at forward.
BAD_FIELDS = [
    ("mgk", "mgk_prior", "bogus"), ("mgk", "attention_type", "foo"), ("mgk", "e_step", "both"),
    ("mgk", "num_keys", 0), ("mgk", "num_keys", True), ("mgk", "num_keys", 2.0),
    ("mgk", "mgk_variances", ["1", "3"]), ("mgk", "mgk_variances", [1.0, -3.0]), ("mgk", "mgk_variances", 3.0),
    ("mgk", "mgk_variances", [1.0, float("nan")]), ("mgk", "mgk_variances", [1.0, True]),
    ("mgk", "head_dim", 3.0), ("mgk", "head_dim", "8"),
    ("fish", "num_global_heads", 0), ("fish", "num_global_heads", 4), ("fish", "num_global_heads", "2"),
    ("fish", "attention_type", "foo"), ("fish", "head_dim", 3.0), ("fish", "fish_noise_init", "0.1"),
    ("nprf", "attention_type", "foo"), ("nprf", "num_random_features", 16.0), ("nprf", "normalize_qk", 1),
    ("nprf", "feature_redraw_interval", -1), ("nprf", "head_dim", 3.0),
]


def _family(name):
    from hf_mgk import FiSHGPT2Model, MGKBertModel, NPRFRobertaModel
    return {"mgk": (MGKBertConfig, MGKBertModel, ENCODER), "fish": (FiSHGPT2Config, FiSHGPT2Model, GPT2),
            "nprf": (NPRFRobertaConfig, NPRFRobertaModel, ENCODER)}[name]


@pytest.fixture(scope="module")
def saved_folders(tmp_path_factory):
    folders = {}
    for name in ("mgk", "fish", "nprf"):
        config_cls, model_cls, sizes = _family(name)
        folders[name] = tmp_path_factory.mktemp(name)
        model_cls(config_cls(**sizes)).save_pretrained(folders[name])
    return folders


@pytest.mark.parametrize("family,field,value", BAD_FIELDS, ids=[f"{f}-{k}={v!r}" for f, k, v in BAD_FIELDS])
def test_every_path_that_makes_a_config_checks_the_field(family, field, value, saved_folders, tmp_path):
    import json

    from transformers import AutoConfig, AutoModel

    config_cls, model_cls, sizes = _family(family)
    folder = saved_folders[family]
    makers = {
        "constructor": lambda: config_cls(**{**sizes, field: value}),
        "config.from_pretrained": lambda: config_cls.from_pretrained(folder, **{field: value}),
        "AutoConfig.from_pretrained": lambda: AutoConfig.from_pretrained(folder, **{field: value}),
        "model.from_pretrained": lambda: model_cls.from_pretrained(folder, **{field: value}),
        "AutoModel.from_pretrained": lambda: AutoModel.from_pretrained(folder, **{field: value}),
    }
    edited = tmp_path / "edited"
    edited.mkdir()
    config_json = json.loads((folder / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config_json, field: value}))
    makers["hand-edited config.json"] = lambda: AutoConfig.from_pretrained(edited)
    for path, make in makers.items():
        with pytest.raises(ValueError, match=field):
            make()
            pytest.fail(f"{path} accepted {field}={value!r}")


@pytest.mark.parametrize("family,field,value", [("mgk", "mgk_prior", "bogus"), ("fish", "num_global_heads", 0),
                                                ("nprf", "use_rpe", "no")])
def test_a_field_set_by_hand_is_checked_before_saving(family, field, value, tmp_path):
    """The re-saved folder would not load: refuse to write it, naming the field, and leave no config.json."""
    config_cls, _, sizes = _family(family)
    config = config_cls(**sizes)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=field):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


def test_keyword_paths_still_apply_good_values(saved_folders):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(saved_folders["mgk"], mgk_prior="em", mgk_variances=[1, 5])
    assert config.mgk_prior == "em" and config.mgk_variances == [1.0, 5.0]
    assert all(type(v) is float for v in config.mgk_variances)
    config, unused = MGKBertConfig.from_pretrained(saved_folders["mgk"], num_keys=3, mgk_variances=[1.0, 2.0, 4.0],
                                                   keep_heads=[0], return_unused_kwargs=True)
    assert config.num_keys == 3 and unused == {"keep_heads": [0]}
    with pytest.raises(ValueError, match=r"mgk_variances must have num_keys=3 entries"):
        MGKBertConfig.from_pretrained(saved_folders["mgk"], num_keys=3)  # the saved [1, 3] no longer fits
    assert FiSHGPT2Config.from_pretrained(saved_folders["fish"], num_global_heads=3).num_global_heads == 3
    # a new head count keeps the saved head size (32 / 4 = 8), as the warm start with fewer heads does
    config = NPRFRobertaConfig.from_pretrained(saved_folders["nprf"], num_attention_heads=3)
    assert (config.num_attention_heads, config.head_dim) == (3, 8)
    assert NPRFRobertaConfig.from_pretrained(saved_folders["nprf"], num_attention_heads=4).head_dim is None


def test_a_new_num_keys_when_loading_takes_its_default_variances(tmp_path):
    from transformers import BertConfig, BertModel

    from hf_mgk import MGKBertConfig, MGKBertModel

    stock = tmp_path / "bert"
    BertModel(BertConfig(**tiny.bert_size(num_hidden_layers=1))).save_pretrained(stock)
    model = MGKBertModel.from_pretrained(stock, attention_type="mgk", num_keys=3)
    assert model.config.num_keys == 3 and model.config.mgk_variances == [1.0, 3.0, 5.0]
    ours = tmp_path / "mgk"
    MGKBertModel(MGKBertConfig(**tiny.bert_size(num_hidden_layers=1), mgk_variances=[1.0, 0.5])).save_pretrained(ours)
    # Variances the checkpoint chose are kept: a different num_keys is then an error naming them, not a silent reset.
    with pytest.raises(ValueError, match="mgk_variances must have num_keys=3 entries"):
        MGKBertConfig.from_pretrained(ours, num_keys=3)
    assert MGKBertConfig.from_pretrained(ours, num_keys=3, mgk_variances=[1, 2, 3]).mgk_variances == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("family, stock", [("MGKBertForMaskedLM", "BertForMaskedLM"),
                                           ("MGKGPT2LMHeadModel", "GPT2LMHeadModel"),
                                           ("FiSHGPT2LMHeadModel", "GPT2LMHeadModel"),
                                           ("NPRFRobertaForMaskedLM", "RobertaForMaskedLM")])
def test_a_warm_start_from_a_stock_checkpoint_is_of_the_family(tmp_path, family, stock):
    """A stock checkpoint's config.json names its own model_type ("bert"): the family's model warm-started from it
    says the family's everywhere (the config's attribute as its saved dict), so the model card and the export,
    which read config.model_type, find the family."""
    import transformers

    import hf_mgk
    import tiny
    from hf_mgk.hub import model_card

    fields = tiny.bert() if "Bert" in stock else tiny.roberta() if "Roberta" in stock else tiny.gpt2()
    stock_cls = getattr(transformers, stock)
    stock_cls(stock_cls.config_class(**fields)).save_pretrained(tmp_path)
    model = getattr(hf_mgk, family).from_pretrained(tmp_path)
    assert model.config.model_type == type(model.config).model_type == model.config.to_dict()["model_type"]
    assert model.config.model_type != stock_cls.config_class.model_type
    assert f"model_type: {model.config.model_type}" in model_card(model, None)
