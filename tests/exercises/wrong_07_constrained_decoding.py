"""Planted wrong answers for chapter 07."""


def allowed_tokens__first_byte_only(dfa, state, token_bytes):
    return {i for i, data in enumerate(token_bytes) if data and dfa.transitions[state, data[0]] >= 0}


def allowed_tokens__lets_empty_tokens_through(dfa, state, token_bytes):
    return {i for i, data in enumerate(token_bytes) if data is not None and dfa.walk(data, state) >= 0}


def allowed_tokens__walks_from_the_start(dfa, state, token_bytes):
    return {i for i, data in enumerate(token_bytes) if data and dfa.walk(data) >= 0}


def choice_regex__unescaped(choices):
    return "(" + "|".join(choices) + ")"
