"""The BERT/RoBERTa encoder stack with a pluggable self-attention, shared by MGK-BERT and NPRF-RoBERTa.

Module and weight names are BERT's (`attention.self`, `attention.output.dense`, `intermediate.dense`,
`output.dense`, ...), so stock BERT and RoBERTa checkpoints load. Only the self-attention class differs between
families; it takes (hidden_states, attention_mask, **kwargs) and returns (output (B, N, H * head_dim), weights).
Imports torch, transformers and siblings only (remote code)."""

from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput
from transformers.pytorch_utils import apply_chunking_to_forward

from .modeling_common import run_layers


class EncoderSelfOutput(nn.Module):
    """BERT's attention output block; the projection maps H * head_dim (not necessarily hidden_size) back."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.num_attention_heads * config.attention_head_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class EncoderAttention(nn.Module):
    def __init__(self, config, self_attention_class, layer_idx=None):
        super().__init__()
        self.self = self_attention_class(config, layer_idx=layer_idx)
        self.output = EncoderSelfOutput(config)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        attention_output, weights = self.self(hidden_states, attention_mask, **kwargs)
        return self.output(attention_output, hidden_states), weights


class EncoderLayer(GradientCheckpointingLayer):
    def __init__(self, config, self_attention_class, layer_idx=None):
        super().__init__()
        self.chunk_size_feed_forward = config.chunk_size_feed_forward
        self.attention = EncoderAttention(config, self_attention_class, layer_idx=layer_idx)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        attention_output, weights = self.attention(hidden_states, attention_mask, **kwargs)
        output = apply_chunking_to_forward(self.feed_forward_chunk, self.chunk_size_feed_forward, 1, attention_output)
        return output, weights

    def feed_forward_chunk(self, attention_output):
        return self.output(self.intermediate(attention_output), attention_output)


class Encoder(nn.Module):
    def __init__(self, config, self_attention_class):
        super().__init__()
        self.layer = nn.ModuleList(
            EncoderLayer(config, self_attention_class, layer_idx=i) for i in range(config.num_hidden_layers)
        )

    def forward(self, hidden_states, attention_mask=None, output_hidden_states=False, **kwargs):
        """(last hidden state, all hidden states or None, attention weights or None): see `run_layers`."""
        return run_layers(self.layer, hidden_states, attention_mask, output_hidden_states=output_hidden_states,
                          **kwargs)
