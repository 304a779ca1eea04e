"""Command line: `nano-infer generate "prompt"` streams a completion; `nano-infer serve` runs the API server."""
from __future__ import annotations

import argparse
import sys


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="hub id, local folder or .gguf file (default: NANO_INFER_MODEL, "
                   "Qwen2.5-1.5B-Instruct on CUDA, else the model shipped in the package)")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
    p.add_argument("--kv-cache", default="paged", choices=["none", "contiguous", "paged"])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prefix-cache", default="auto", choices=["auto", "none", "hash", "radix"])
    p.add_argument("--attention", default="gather", choices=["gather", "blockwise"])
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)


def engine_kwargs(args: argparse.Namespace) -> dict:
    return dict(dtype=args.dtype, device=args.device, kv_cache=args.kv_cache, block_size=args.block_size,
                prefix_cache=None if args.prefix_cache == "none" else args.prefix_cache,
                attention=args.attention, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs)


def generate(args: argparse.Namespace) -> int:
    from .engine import LLMEngine
    from .sampling_params import SamplingParams

    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                                seed=args.seed, ignore_eos=args.ignore_eos)
        engine = LLMEngine(args.model, **engine_kwargs(args))
        if args.chat:
            ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}],
                                                       add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            engine.add_request("cli", None, params, prompt_token_ids=ids, stream=True)
        else:
            engine.add_request("cli", args.prompt, params, stream=True)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    printed = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            text = out.outputs[0].text
            sys.stdout.write(text[printed:])
            sys.stdout.flush()
            printed = len(text)
    sys.stdout.write("\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nano-infer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete a prompt, streaming the text to the terminal")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    add_engine_args(gen)
    gen.set_defaults(func=generate)
    try:
        from .cli_serve import add_serve_parser
    except ImportError:  # the server's dependencies (fastapi, uvicorn) are optional at import time
        add_serve_parser = None
    if add_serve_parser is not None:
        add_serve_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
