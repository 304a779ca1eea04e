"""vLLM's offline names with vLLM's meanings: EngineArgs and its parser, the options
that mean nothing here, reset_prefix_cache, max_tokens capped at the context, SamplingParams' vLLM fields,
an assistant turn with tool_calls and no content, AsyncLLM.generate(sampling_params=), Host: 0.0.0.0."""
import asyncio
import dataclasses
import importlib

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from nano_infer import LLM, AsyncEngineArgs, AsyncLLM, EngineArgs, LLMEngine, SamplingParams
from nano_infer.api_server.guard import Drain, _Guard, allowed_hosts_for
from nano_infer.api_server.limits import ServerLimits
from nano_infer.api_server.tenants import Tenants
from nano_infer.compilation import compile_sizes
from nano_infer.models.loader import TINY_MODEL_DIR
from nano_infer.sampling_params import RequestOutputKind

MODEL = str(TINY_MODEL_DIR)


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL, max_model_len=64, block_size=4, num_kv_blocks=64)


# -- EngineArgs, AsyncEngineArgs, FlexibleArgumentParser -------------------------------------------------------
def test_vllm_import_paths_lead_to_the_same_classes():
    from nano_infer import EngineArgs as top

    assert importlib.import_module("nano_infer.engine.arg_utils").EngineArgs is top
    assert importlib.import_module("nano_infer.engine.arg_utils").AsyncEngineArgs is AsyncEngineArgs
    parser = importlib.import_module("nano_infer.utils").FlexibleArgumentParser
    assert importlib.import_module("nano_infer.utils.argparse_utils").FlexibleArgumentParser is parser


def test_flexible_parser_takes_underscores_and_equals_and_leaves_values_alone():
    from nano_infer.utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--max_model_len=128", "--tokenizer", "my_tok", "--gpu_memory_utilization", "0.5",
                              "--enforce_eager", "--speculative_config", '{"method": "ngram", "num_speculative_tokens": 2}'])
    engine_args = EngineArgs.from_cli_args(args)
    assert (engine_args.max_model_len, engine_args.tokenizer, engine_args.gpu_memory_utilization) == (128, "my_tok", 0.5)
    assert engine_args.enforce_eager is True and engine_args.speculative_config == {"method": "ngram",
                                                                                      "num_speculative_tokens": 2}
    assert EngineArgs.from_cli_args(parser.parse_args(["--prefix-cache", "none"])).prefix_cache is None
    sized = EngineArgs.from_cli_args(parser.parse_args(["--compilation-config", '{"compile_sizes": [1, 2, 4, 8]}']))
    assert sized.compilation_config == {"compile_sizes": [1, 2, 4, 8]}
    assert compile_sizes(sized.create_engine_config()) == (1, 2, 4, 8)


def test_engine_args_fields_are_the_engine_options_and_vllm_s_no_ops_at_their_defaults():
    names = {f.name for f in dataclasses.fields(EngineArgs)}
    assert {"model", "tokenizer", "dtype", "seed", "max_model_len", "block_size", "gpu_memory_utilization",
            "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "tensor_parallel_size",
            "enforce_eager", "kv_cache_dtype", "quantization", "speculative_config", "swap_space",
            "pipeline_parallel_size", "tokenizer_mode"} <= names
    assert {"enable_log_requests"} <= {f.name for f in dataclasses.fields(AsyncEngineArgs)} - names
    config = EngineArgs(model=MODEL, max_model_len=100, enable_prefix_caching=False).create_engine_config()
    assert (config.max_model_len, config.prefix_cache) == (100, None)


def test_a_vllm_option_set_to_what_it_cannot_mean_here_is_refused_by_name_before_loading():
    with pytest.raises(ValueError, match=r"pipeline_parallel_size=2 is a vLLM option that nano_infer cannot honour "
                                         r"\(there is no pipeline parallelism; use tensor_parallel_size\); leave it at 1"):
        LLM(**dataclasses.asdict(EngineArgs(model=MODEL, pipeline_parallel_size=2)))
    with pytest.raises(ValueError, match="tokenizer_mode='mistral' .* leave it at 'auto' or 'hf'"):
        LLMEngine.from_engine_args(EngineArgs(model=MODEL, tokenizer_mode="mistral"))
    with pytest.raises(ValueError, match="logits_processors: .* is not a subclass of LogitsProcessor"):
        LLM(MODEL, logits_processors=[object])  # vLLM's v1 interface is taken (tests/engine/test_custom_logits.py)
    with pytest.raises(TypeError, match="unknown engine option"):
        LLM(MODEL, no_such_option=1)


def test_llm_engine_from_engine_args_keeps_every_option():
    engine = LLMEngine.from_engine_args(EngineArgs(model=MODEL, max_model_len=48, block_size=8, num_kv_blocks=12,
                                                   swap_space=4, enforce_eager=True))
    assert (engine.max_model_len, engine.kv.block_size, engine.kv.num_blocks, engine.config.enforce_eager) == (
        48, 8, 12, True)


# -- reset_prefix_cache -----------------------------------------------------------------------------------------
def test_reset_prefix_cache_drops_idle_blocks_and_says_false_while_a_running_request_holds_some(llm):
    engine, prompt = llm.engine, list(range(10, 30))
    greedy = SamplingParams(temperature=0, max_tokens=2)
    llm.generate({"prompt_token_ids": prompt}, greedy)
    assert engine.prefix_cache.num_cached_blocks() > 0
    assert llm.reset_prefix_cache() is True and engine.prefix_cache.num_cached_blocks() == 0
    assert llm.generate({"prompt_token_ids": prompt}, greedy)[0].num_cached_tokens == 0  # recomputed, not reused
    engine.add_request("held", None, SamplingParams(temperature=0, max_tokens=30), prompt_token_ids=list(range(40, 60)))
    engine.step()
    assert engine.reset_prefix_cache() is False  # the running request's full blocks stay cached, as in vLLM
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.reset_prefix_cache() is True and engine.kv.num_free_blocks == engine.kv.num_blocks


# -- max_tokens beyond the context ------------------------------------------------------------------------------
def test_max_tokens_beyond_the_context_is_capped_at_what_the_prompt_leaves(llm):
    out = llm.generate({"prompt_token_ids": [7] * 60}, SamplingParams(max_tokens=1000, ignore_eos=True))[0]
    assert (len(out.outputs[0].token_ids), out.outputs[0].finish_reason) == (4, "length")
    with pytest.raises(ValueError, match="prompt has 64 tokens; the limit is max_model_len - 1 = 63"):
        llm.generate({"prompt_token_ids": [7] * 64}, SamplingParams(max_tokens=1))


# -- SamplingParams' vLLM fields --------------------------------------------------------------------------------
def test_from_optional_takes_none_as_the_default_and_clone_is_deep():
    p = SamplingParams.from_optional(n=None, temperature=0.5, max_tokens=None, stop=["x"], seed=None,
                                     extra_args={"tag": [1]})
    assert (p.n, p.temperature, p.max_tokens, p.stop, p.seed) == (1, 0.5, 16, ["x"], None)
    q = p.clone()
    q.stop.append("y")
    q.extra_args["tag"].append(2)
    assert p.stop == ["x"] and p.extra_args == {"tag": [1]} and q.extra_args == {"tag": [1, 2]}


def test_best_of_is_accepted_equal_to_n_and_refused_otherwise_saying_why():
    assert SamplingParams(n=3, best_of=3).best_of == 3
    with pytest.raises(ValueError, match=r"best_of=4 is invalid: must be None or equal to n=2: vLLM's best_of > n "
                                         r"samples best_of and returns the n most likely"):
        SamplingParams(n=2, best_of=4)


def test_output_kind_and_detokenize_are_checked():
    with pytest.raises(ValueError, match="output_kind='delta' is invalid: must be a RequestOutputKind"):
        SamplingParams(output_kind="delta")
    with pytest.raises(ValueError, match="detokenize=False is invalid: .*True with stop strings"):
        SamplingParams(detokenize=False, stop=["."])


def test_detokenize_false_gives_token_ids_and_empty_text_and_every_output_kind_gives_final_outputs(llm):
    prompt = {"prompt_token_ids": [5, 6, 7]}
    plain = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=5))[0].outputs[0]
    bare = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=5, detokenize=False))[0].outputs[0]
    assert bare.token_ids == plain.token_ids and bare.text == "" and plain.text
    for kind in RequestOutputKind:
        out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=5, output_kind=kind))[0]
        assert out.finished and out.outputs[0].text == plain.text


# -- chat: an assistant turn with tool_calls and no content -------------------------------------------------------
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def test_an_assistant_turn_with_tool_calls_and_no_content_reaches_the_template_as_vllm_gives_it(llm):
    def turns(assistant):
        return [{"role": "user", "content": "Weather in Paris?"}, assistant,
                {"role": "tool", "content": "22 C", "tool_call_id": "call_1", "name": "get_weather"}]

    missing = llm.apply_chat_template(turns({"role": "assistant", "tool_calls": [CALL]}))
    null = llm.apply_chat_template(turns({"role": "assistant", "content": None, "tool_calls": [CALL]}))
    empty = llm.apply_chat_template(turns({"role": "assistant", "content": "", "tool_calls": [CALL]}))
    assert missing == null == empty
    out = llm.chat(turns({"role": "assistant", "content": None, "tool_calls": [CALL]}),
                   SamplingParams(temperature=0, max_tokens=3))
    assert len(out[0].outputs[0].token_ids) == 3
    with pytest.raises(ValueError, match=r"messages\[0\] has no content \(only an assistant message with tool_calls"):
        llm.chat([{"role": "user"}])


def test_the_template_gets_a_call_s_arguments_as_an_object():
    from nano_infer.text.chat_template import template_messages

    (m,) = template_messages([{"role": "assistant", "tool_calls": [CALL]}])
    assert m["content"] == "" and m["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert CALL["function"]["arguments"] == '{"city": "Paris"}'  # the caller's message is left as it was


# -- AsyncLLM: vLLM's generate arguments and output kinds --------------------------------------------------------
def test_async_llm_takes_sampling_params_by_vllm_s_name_and_output_kind_final_only():
    allm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=MODEL, max_model_len=64, enable_log_requests=True))

    async def collect(**kwargs):
        return [o async for o in allm.generate([5, 6, 7], request_id=kwargs.pop("request_id"), **kwargs)]

    try:
        greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        by_vllm_name = asyncio.run(collect(sampling_params=greedy, request_id="a"))
        by_old_name = asyncio.run(collect(params=greedy, request_id="b"))
        tokens = [[t for o in outs for t in o.outputs[0].token_ids] for outs in (by_vllm_name, by_old_name)]
        assert tokens[0] == tokens[1] and len(tokens[0]) == 4  # DELTA: each output holds only new tokens
        final = asyncio.run(collect(sampling_params=dataclasses.replace(greedy, output_kind=RequestOutputKind.FINAL_ONLY),
                                    request_id="c"))
        assert len(final) == 1 and len(final[0].outputs[0].token_ids) == 4
        with pytest.raises(TypeError, match="give sampling_params or params"):
            asyncio.run(collect(sampling_params=greedy, params=greedy, request_id="d"))
    finally:
        allm.shutdown()


# -- Host: 0.0.0.0 ----------------------------------------------------------------------------------------------
def host_status(allowed, host: str) -> int:
    limits = ServerLimits()
    app = Starlette(routes=[Route("/health", lambda request: JSONResponse({}))])
    app.add_middleware(_Guard, allowed_hosts=allowed, limits=limits, tenants=Tenants((), limits), drain=Drain())

    async def get():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as client:
            return (await client.get("/health", headers={"host": host})).status_code

    return asyncio.run(get())


def test_host_0_0_0_0_is_this_machine_and_a_rebinding_name_is_still_refused():
    local = allowed_hosts_for("127.0.0.1")
    assert host_status(local, "0.0.0.0:8000") == 200 and host_status(local, "evil.example:8000") == 400
    everywhere_named = allowed_hosts_for("0.0.0.0", ("api.example",))
    assert host_status(everywhere_named, "0.0.0.0:8000") == 200 and host_status(everywhere_named, "api.example") == 200
    assert host_status(everywhere_named, "evil.example") == 400
    assert allowed_hosts_for("0.0.0.0") is None and allowed_hosts_for("10.0.0.5", ("api.example",)) == ("api.example",)
