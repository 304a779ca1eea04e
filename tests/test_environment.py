"""environment.yml (for conda users) lists exactly the package's dependencies, extras included."""
import tomllib
from pathlib import Path

import re

ROOT = Path(__file__).parent.parent


def names(requirements):
    return {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted |= set(extra)
    lines = [line.strip()[2:].strip() for line in (ROOT / "environment.yml").read_text().splitlines()
             if line.strip().startswith("- ") and line.startswith(" " * 6)]
    listed = {line for line in lines if not line.startswith("-e")}
    assert names(listed) == names(wanted)
    assert listed == wanted, "version ranges differ"
