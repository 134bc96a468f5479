"""docs/python.md and the README's Python section: their code parses and names only what kiln has."""
import ast
import re

import pytest

import kiln
from conftest import SOURCE_DIR

DOCS = SOURCE_DIR / "docs" / "python.md"
README = SOURCE_DIR / "README.md"


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def kiln_names(code):
    """Every kiln.X / kiln.cache.X attribute chain the code uses."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Attribute):
            chain, n = [], node
            while isinstance(n, ast.Attribute):
                chain.append(n.attr)
                n = n.value
            if isinstance(n, ast.Name) and n.id == "kiln":
                names.add(".".join(reversed(chain)))
    return names


@pytest.mark.parametrize("path", [DOCS, README], ids=["docs/python.md", "README.md"])
def test_code_blocks_parse_and_name_real_api(path):
    if not path.exists():
        pytest.skip(f"{path} is not here (KILN_SOURCE_DIR)")
    blocks = python_blocks(path)
    assert blocks, f"no python blocks in {path}"
    for code in blocks:
        for name in kiln_names(code):
            obj = kiln
            parts = name.split(".")
            if parts[0] in ("torch", "distributed"):
                continue  # they need torch: test_torch.py and test_distributed.py cover them
            for part in parts:
                if part in ("stats",) and obj is kiln.current_tuner:
                    break
                obj = getattr(obj, part, None)
                assert obj is not None, f"{path.name}: kiln.{name} does not exist"


def test_recipe_is_ten_lines():
    text = DOCS.read_text()
    recipe = text.split("<!-- recipe: tested by python/tests/test_warmup.py -->")[1]
    code = re.search(r"```python\n(.*?)```", recipe, re.S).group(1)
    assert len([l for l in code.splitlines() if l.strip()]) <= 11
