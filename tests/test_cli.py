"""The command line tells a newcomer what they are running: defaults in --help, the default model named."""
import pytest

from nano_infer.cli import announce_default_model, main


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
