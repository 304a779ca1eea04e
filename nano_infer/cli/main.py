"""Command line: `nano-infer generate "prompt"` streams a completion; `nano-infer serve` runs the API server."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .engine_args import add_engine_args, engine_kwargs


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, except where there is none to show (None, a flag's False)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action) or ""


def announce_default_model() -> None:
    """No --model given: say which model loads, since the shipped one writes nonsense by design."""
    from ..models.loader import TINY_MODEL_DIR, default_model

    model = default_model()
    if Path(model).resolve() != TINY_MODEL_DIR.resolve():
        print(f"model: {model} (the default; --model or NANO_INFER_MODEL picks another)", file=sys.stderr)
        return
    from safetensors import safe_open

    with safe_open(str(TINY_MODEL_DIR / "model.safetensors"), "pt") as f:
        params = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    print(f"model: the one shipped in the package, a {params / 1e6:.1f}M-parameter chat model trained on "
          "Shakespeare's plays so that everything runs offline on a CPU. Its replies are Shakespeare-flavoured "
          "nonsense by design. --model <hub id or folder> (or NANO_INFER_MODEL) loads a real one, e.g. "
          "Qwen/Qwen2.5-1.5B-Instruct.", file=sys.stderr)


def _params(args: argparse.Namespace):
    from ..beam import BeamSearchParams
    from ..sampling_params import SamplingParams

    if args.beam_width is None:
        return SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                              seed=args.seed, ignore_eos=args.ignore_eos)
    if args.seed is not None or args.top_p != 1.0:
        raise ValueError("--seed and --top-p sample; beam search (--beam-width) does not")
    return BeamSearchParams(args.beam_width, args.max_tokens, ignore_eos=args.ignore_eos,
                            temperature=args.temperature, length_penalty=args.length_penalty)


def generate(args: argparse.Namespace) -> int:
    from ..engine.llm_engine import LLMEngine

    try:
        params = _params(args)
        engine = LLMEngine(args.model, **engine_kwargs(args))
        stream = args.beam_width is None
        if args.chat:
            ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}],
                                                       add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            engine.add_request("cli", None, params, prompt_token_ids=ids, stream=stream)
        else:
            engine.add_request("cli", args.prompt, params, stream=stream)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not stream:
        return _print_beams(engine, params)
    printed = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            text = out.outputs[0].text
            sys.stdout.write(text[printed:])
            sys.stdout.flush()
            printed = len(text)
    sys.stdout.write("\n")
    return 0


def _print_beams(engine, params) -> int:
    """Beam search ends all at once: each hypothesis on its own line, best first, with its score."""
    from ..beam import length_penalised

    out = None
    while engine.has_unfinished_requests():
        out = next((o for o in engine.step() if o.finished), out)
    for rank, c in enumerate(out.outputs, 1):
        score = length_penalised([c.cumulative_logprob], len(c.token_ids), params.length_penalty)[0]
        print(f"[{rank}] score {score:.4f}, logprob {c.cumulative_logprob:.4f}, {len(c.token_ids)} tokens, "
              f"{c.finish_reason}")
        print("    " + c.text.replace("\n", "\n    "))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nano-infer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete a prompt, streaming the text to the terminal")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold")
    gen.add_argument("--seed", type=int, default=None, help="makes a sampled completion reproducible")
    gen.add_argument("--ignore-eos", action="store_true", help="keep going past the end-of-sequence token")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    gen.add_argument("--beam-width", type=int, default=None,
                     help="beam search with this many beams: prints the best hypotheses, not a stream")
    gen.add_argument("--length-penalty", type=float, default=1.0,
                     help="beam search: a hypothesis scores logprob / length ** this")
    add_engine_args(gen)
    gen.set_defaults(func=generate)
    try:
        from .serve import add_serve_parser
    except ImportError:  # the server's dependencies (fastapi, uvicorn) are optional at import time
        add_serve_parser = None
    if add_serve_parser is not None:
        add_serve_parser(sub)
    for p in (parser, *sub.choices.values()):
        p.formatter_class = _HelpWithDefaults
    args = parser.parse_args(argv)
    from ..distributed import run_worker, torchrun_launch

    launch = torchrun_launch()
    if launch is not None and launch.rank > 0:  # torchrun started every rank with this command: rank 0 drives
        run_worker(args.device)
        return 0
    if getattr(args, "model", "") is None:
        announce_default_model()
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
