"""config/safe_yaml.py: ordinary YAML (anchors included) loads; bombs, deep nesting and huge integers do not."""

from __future__ import annotations

import pytest
import yaml

from gpuwatchd.config.safe_yaml import MAX_DEPTH, MAX_NODES, load_yaml


def test_ordinary_documents_and_anchors_load() -> None:
    text = "base: &h {X-Team: gpu}\nreceivers:\n- {name: a, headers: *h}\n- {name: b, headers: *h, port: 0x1F90}\n"
    data = load_yaml(text)
    assert data["receivers"][0]["headers"] == {"X-Team": "gpu"} and data["receivers"][1]["port"] == 8080
    assert load_yaml("") is None
    assert load_yaml("n: 18446744073709551615\n") == {"n": 2**64 - 1}
    assert load_yaml("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)) is not None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a: " + "[" * (MAX_DEPTH + 1), "nested deeper than"),
        ("n: " + "9" * 5000, "integer too long"),
        ("n: 18446744073709551616", "integer out of range"),
        ("n: -0x" + "f" * 17, "integer out of range"),
        ("a: &a [*a]", "an alias refers to a node that contains it"),
        ("a: !!python/name:os.system ''", "could not determine a constructor"),
    ],
    ids=["deep", "long-int", "u64-overflow", "negative-hex", "recursive", "python-tag"],
)
def test_hostile_documents_are_yaml_errors(text: str, problem: str) -> None:
    with pytest.raises(yaml.YAMLError, match=problem):
        load_yaml(text)


def test_alias_bombs_are_bounded_by_their_expanded_size() -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    with pytest.raises(yaml.YAMLError, match=f"more than {MAX_NODES} values"):
        load_yaml("\n".join(levels))
    # a chain of aliases deeper than the nesting bound, each level small
    chain = ["l0: &l0 [x]"] + [f"l{i}: &l{i} [*l{i - 1}]" for i in range(1, MAX_DEPTH + 2)]
    with pytest.raises(yaml.YAMLError, match="nested deeper than"):
        load_yaml("\n".join(chain))
