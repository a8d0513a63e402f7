"""YAML config files: PyYAML's SafeLoader without aliases (no billion laughs), without duplicate
keys (the second would silently win), with bounded nesting (no RecursionError) and bounded
numbers. Imported by :func:`preflight.core.config.load_file` only for a YAML file, so a run
without one never loads PyYAML."""

from __future__ import annotations

from typing import Any

import yaml

from preflight.core.config import _MAX_NUMBER_CHARS, MAX_DEPTH, shown

#: What a text that is not valid YAML raises.
YAMLError = yaml.YAMLError


class _StrictLoader(yaml.SafeLoader):
    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in a preflight config",
                event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> Any:
        text = str(node.value)
        if len(text) > _MAX_NUMBER_CHARS:
            raise yaml.constructor.ConstructorError(
                None, None, f"a number of {len(text)} characters (at most {_MAX_NUMBER_CHARS})",
                node.start_mark)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shown(key)}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


def parse(text: str) -> Any:
    """The data of one YAML document; raises :data:`YAMLError` (and, on hostile input, what
    :func:`preflight.core.config.load_file` turns into a ConfigError as well)."""
    return yaml.load(text, Loader=_StrictLoader)
