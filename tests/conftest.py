"""Shared fixtures: no network, a small byte-level tokenizer, random-weight models of three families."""
import os
import socket

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("NANO_INFER_COMPILE", "0")  # engines decode eagerly unless a test asks (enforce_eager=False): a compile takes tens of seconds

import pytest  # noqa: E402
import torch  # noqa: E402

_connect = socket.socket.connect


def _loopback_only(self, address):
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and not (host.startswith("127.") or host in ("localhost", "::1") or self.family == socket.AF_UNIX):
        raise OSError(f"tests may not reach the network (tried {address!r})")
    return _connect(self, address)


socket.socket.connect = _loopback_only
torch.set_num_threads(min(2, torch.get_num_threads()))

from tests.helpers.model_factory import make_model_dir, make_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="session", params=["qwen2", "qwen3", "llama"])
def model_dir(request, tmp_path_factory, tokenizer):
    """A random-weight model of each family (scaled-down real config), saved like a hub checkpoint."""
    return make_model_dir(request.param, tmp_path_factory.mktemp(request.param), tokenizer)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory, tokenizer):
    return make_model_dir("qwen2", tmp_path_factory.mktemp("qwen2_only"), tokenizer)


@pytest.fixture(scope="module")
def allm(served):
    """The AsyncLLM of a module's `served` fixture (an (AsyncLLM, BackgroundServer) pair)."""
    return served[0]


@pytest.fixture(scope="module")
def server(served):
    return served[1]


@pytest.fixture(scope="module")
def client(server):
    """An OpenAI client on the module's server (no retries: a test sees each answer as the server gave it)."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def model(allm):
    """The model name the module's server answers to."""
    return allm.stats.model_name
