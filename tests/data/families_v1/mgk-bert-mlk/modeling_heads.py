"""Task-head forwards shared by every family: each model class keeps HF's module names for its head weights
(`cls` / `lm_head`, `classifier`, `qa_outputs`, ...) and supplies one small hook; the forward, the loss and the
outputs are written once here. Every loss honours Trainer's `num_items_in_batch` (or, for QA, receives none),
so gradient accumulation and several processes give the step of the whole batch.

The base model is `self.base_model` (HF's property: the attribute named by `base_model_prefix`).
Imports torch, transformers and siblings only (remote code)."""

from transformers.modeling_outputs import (
    CausalLMOutputWithPast,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from .modeling_common import can_return_tuple, classification_loss


def _encode(model, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs):
    return model.base_model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            position_ids=position_ids, inputs_embeds=inputs_embeds, return_dict=True, **kwargs)


class MaskedLMHeadMixin:
    """Hook: `lm_logits(last_hidden_state)`. labels: -100 for tokens that are not predicted."""

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, **kwargs):
        outputs = _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.lm_logits(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                              attentions=outputs.attentions)


class SequenceClassificationHeadMixin:
    """Hook: `classify(base_model_outputs)` -> (B, num_labels). Regression / single- / multi-label as HF's."""

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, **kwargs):
        outputs = _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.classify(outputs)
        loss = None
        if labels is not None:
            loss = classification_loss(self.config, logits, labels, kwargs.get("num_items_in_batch"))
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                        attentions=outputs.attentions)


class TokenClassificationHeadMixin:
    """Uses `self.dropout` and `self.classifier` on every token."""

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, **kwargs):
        outputs = _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config, **kwargs)
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                     attentions=outputs.attentions)


class QuestionAnsweringHeadMixin:
    """Uses `self.qa_outputs` (hidden -> 2): start and end logits of the answer span."""

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, start_positions=None, end_positions=None, **kwargs):
        outputs = _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.qa_outputs(outputs.last_hidden_state)
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            # Trainer counts no "labels" here, so it passes no num_items_in_batch and scales by 1/accumulation.
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                            hidden_states=outputs.hidden_states, attentions=outputs.attentions)


class CausalLMHeadMixin:
    """Uses `self.lm_head`. labels are shifted inside (labels = input_ids works); `logits_to_keep` as HF's."""

    @can_return_tuple
    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                position_ids=None, inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        outputs = self.base_model(input_ids, past_key_values=past_key_values, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids, position_ids=position_ids,
                                  inputs_embeds=inputs_embeds, use_cache=use_cache, return_dict=True, **kwargs)
        hidden_states = outputs.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden_states = hidden_states[:, -logits_to_keep:]
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=outputs.past_key_values,
                                      hidden_states=outputs.hidden_states, attentions=outputs.attentions)
