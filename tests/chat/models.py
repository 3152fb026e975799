"""Small chat models built in tests: random weights, a real ``tokenizers`` byte-level
tokenizer with ChatML special tokens and template (as SmolLM2 ships it: nothing added to
a raw prompt, ``<|im_end|>`` closing each turn), saved as a Hugging Face directory."""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
END_OF_TEXT, IM_START, IM_END = 256, 257, 258
VOCAB = 259


def make_tokenizer(template: str | None = CHATML, remap: dict[str, int] | None = None):
    """Byte ``b`` is id ``b``; the specials follow. ``remap`` moves tokens to other ids
    (swapping with whatever held them) to build an incompatible tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    vocab.update({name: 256 + i for i, name in enumerate(SPECIALS)})
    for token, new_id in (remap or {}).items():
        holder = next(t for t, i in vocab.items() if i == new_id)
        vocab[holder], vocab[token] = vocab[token], new_id
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_end|>"],
    )
    if template is not None:
        fast.chat_template = template
    return fast


def make_chat_model(
    out: Path,
    *,
    arch: str = "llama",
    layers: int = 2,
    seed: int = 0,
    vocab_size: int = VOCAB,
    template: str | None = CHATML,
    remap: dict[str, int] | None = None,
    shard_size: str | None = None,
    from_model: Path | None = None,
) -> Path:
    """Save a random ``arch`` (llama, qwen2 or gpt2) causal LM plus tokenizer to ``out``.
    ``from_model`` copies that model's first ``layers`` layers (a self-speculative draft,
    so greedy acceptance is well above zero); ``shard_size`` saves sharded safetensors."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        GenerationConfig,
        GPT2Config,
        LlamaConfig,
        Qwen2Config,
    )

    torch.manual_seed(seed)
    common = {"vocab_size": vocab_size, "bos_token_id": IM_START, "eos_token_id": END_OF_TEXT}
    if arch == "gpt2":
        config = GPT2Config(n_embd=32, n_layer=layers, n_head=2, n_positions=512, **common)
    else:
        cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
        config = cls(
            hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
            tie_word_embeddings=True, **common,
        )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    if from_model is not None:
        donor = AutoModelForCausalLM.from_pretrained(from_model)
        state = {k: v for k, v in donor.state_dict().items() if k in model.state_dict()}
        model.load_state_dict(state, strict=False)
    model.generation_config = GenerationConfig(
        bos_token_id=IM_START, eos_token_id=[END_OF_TEXT, IM_END]
    )
    out.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(out, **kwargs)
    make_tokenizer(template, remap).save_pretrained(out)
    return out
