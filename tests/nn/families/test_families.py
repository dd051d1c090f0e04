"""The family registry: every public module of nn/families is a family (found, not listed), and
each offers the interface of :class:`coulomb_attention.nn.families.Family` under its own name."""

import inspect

import pytest

from coulomb_attention.nn import families
from coulomb_attention.nn.families import FAMILIES, Family, get_family


def test_every_module_of_the_package_is_a_family_with_the_interface():
    assert {"bert", "llama"} <= set(FAMILIES)
    members = [n for n in Family.__annotations__] + [
        n for n, v in vars(Family).items() if inspect.isfunction(v)]
    assert "NAME" in members and "teacher_rows" in members
    for name, module in FAMILIES.items():
        fam = get_family(name)
        assert fam.__name__ == f"{families.__name__}.{module}"
        assert fam.NAME == name
        missing = [m for m in members if not hasattr(fam, m)]
        assert not missing, f"family {name} lacks {missing}"


def test_a_new_module_registers_by_existing(tmp_path):
    """A family is its module: dropping ``gpt2.py`` beside the others is the registration;
    private modules and subpackages are not families."""
    (tmp_path / "gpt2.py").write_text("NAME = 'gpt2'\n")
    (tmp_path / "_shared.py").write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    assert families._modules([str(tmp_path)]) == {"gpt2": "gpt2"}
    assert list(families._modules(families.__path__)) == sorted(FAMILIES)


def test_an_unknown_family_is_named_with_the_valid_ones():
    with pytest.raises(ValueError, match="bert.*llama|llama.*bert"):
        get_family("gpt3")
