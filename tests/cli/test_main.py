"""The command line tells a newcomer what they are running: defaults in --help, the default model named."""
import pytest

from nano_infer.cli.main import announce_default_model, main


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "most tokens to generate (default: 64)" in text
    assert "where K/V lives (default: paged)" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_default_model_is_named_with_its_size(monkeypatch, capsys):
    monkeypatch.delenv("NANO_INFER_MODEL", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    announce_default_model()
    err = capsys.readouterr().err
    assert "3.8M-parameter" in err and "Shakespeare" in err and "nonsense by design" in err
    monkeypatch.setenv("NANO_INFER_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
    announce_default_model()
    assert "model: Qwen/Qwen2.5-0.5B-Instruct (the default" in capsys.readouterr().err


def test_generate_with_beams_prints_every_hypothesis_best_first(qwen2_dir, capsys):
    from nano_infer import LLM, BeamSearchParams

    expected = LLM(str(qwen2_dir), dtype="float32").beam_search("To be, or not", BeamSearchParams(3, 6))[0]
    capsys.readouterr()
    assert main(["generate", "To be, or not", "--beam-width", "3", "--max-tokens", "6", "--model", str(qwen2_dir),
                 "--dtype", "float32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    headers = [line for line in lines if line.startswith("[")]
    assert [h.split()[0] for h in headers] == ["[1]", "[2]", "[3]"]
    for header, s in zip(headers, expected.sequences):
        assert f"score {s.score:.4f}" in header and f"{len(s.output_tokens)} tokens, {s.finish_reason}" in header
    assert main(["generate", "x", "--beam-width", "2", "--seed", "1", "--model", str(qwen2_dir)]) == 2
    assert "beam search (--beam-width) does not" in capsys.readouterr().err


def test_vllm_flags_become_engine_options():
    import argparse

    from nano_infer.cli.engine_args import add_engine_args, engine_kwargs

    p = argparse.ArgumentParser()
    add_engine_args(p)
    kw = engine_kwargs(p.parse_args(["--no-enable-prefix-caching", "--trust-remote-code", "--tokenizer", "some/tok"]))
    assert (kw["enable_prefix_caching"], kw["trust_remote_code"], kw["tokenizer"]) == (False, True, "some/tok")
    assert engine_kwargs(p.parse_args([]))["enable_prefix_caching"] is None
