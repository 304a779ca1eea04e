"""show_source prints the function a reader asked for, with the lines it really has in its file."""
import inspect

from IPython.core.interactiveshell import InteractiveShell

from nano_infer.engine.model_runner import ModelRunner
from nano_infer.engine.sampling import sample
from nano_infer.viz import show_source


def shown(obj, capsys) -> str:
    InteractiveShell.instance()  # display() prints text/plain when no frontend is attached
    show_source(obj)
    return capsys.readouterr().out


def test_a_decorated_function_shows_its_own_source_and_file(capsys):
    """ModelRunner.run is under @torch.inference_mode(): the listing is run's, from model_runner.py."""
    text = shown(ModelRunner.run, capsys)
    own, first = inspect.getsourcelines(ModelRunner.run.__wrapped__)
    assert "nano_infer/engine/model_runner.py" in text and "_contextlib" not in text
    assert f"lines {first}-{first + len(own) - 1}" in text and "def run(" in text


def test_line_numbers_are_the_file_s(capsys):
    """The listing starts at the decorator line of `sample` in sampling.py, found here by reading the file."""
    text = shown(sample, capsys)
    lines = open(inspect.getsourcefile(sample.__wrapped__)).read().splitlines()
    first = next(i for i, line in enumerate(lines, 1) if line.startswith("def sample(")) - 1
    assert lines[first - 1].startswith("@") and f"sampling.py, lines {first}-" in text
