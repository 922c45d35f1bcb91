"""YAML parsing for files users give us, bounded against hostile documents.

``yaml.safe_load`` constructs no objects, but it still (1) recurses once per nesting level, so a deep document ends
in ``RecursionError``; (2) lets aliases share nodes, so a "billion laughs" document is small to parse and
explodes when validated (every alias is walked again); (3) converts any run of digits with ``int()``, which raises
Python's int-str limit ``ValueError`` past 4300 digits and makes huge numbers below it. :func:`load_yaml` bounds
nesting depth and the size of the document with every alias expanded, refuses recursive aliases and refuses
integers beyond 64 bits, each as a :class:`yaml.YAMLError` with its line and column.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

# Deepest nesting of mappings and lists (aliases included): real configs and scenarios nest 4-6 levels.
MAX_DEPTH = 64
# Nodes of the document with every alias expanded: ~100x the largest built-in scenario; a billion-laughs document
# passes this within its first few levels.
MAX_NODES = 200_000
# An integer longer than this in digits is beyond 64 bits whatever its base prefix.
_MAX_INT_CHARS = 80
_INT_LIMIT = 1 << 64


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader with a depth bound while composing and a 64-bit bound on integers."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: ScalarNode) -> int:
        text = str(node.value)
        if len(text.replace("_", "")) > _MAX_INT_CHARS:
            raise ConstructorError(None, None, "integer too long", node.start_mark)
        value = int(super().construct_yaml_int(node))
        if abs(value) >= _INT_LIMIT:
            raise ConstructorError(None, None, "integer out of range (beyond 64 bits)", node.start_mark)
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def load_yaml(text: str) -> Any:
    """The single YAML document in ``text``, parsed safely and within the bounds above."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expanded(root: Node) -> None:
    """Refuse a graph whose alias-expanded size or depth is past the bounds, or that contains itself."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, expanded depth)
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = _children(node)
        if done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(k)][0] for k in kids)
            depth = 1 + max((sizes[id(k)][1] for k in kids), default=0)
            if total > MAX_NODES:
                raise ComposerError(None, None, f"document too large with its aliases expanded "
                                    f"(more than {MAX_NODES} values)", node.start_mark)
            if depth > MAX_DEPTH:
                raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels with its aliases "
                                    "expanded", node.start_mark)
            sizes[key] = (total, depth)
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise ComposerError(None, None, "an alias refers to a node that contains it", node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in sizes)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []
