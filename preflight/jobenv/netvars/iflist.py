"""NCCL's interface and HCA list syntax (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``), parsed as NCCL
parses it (src/misc/utils.cc ``parseStringList`` / ``matchIfList``).

A leading ``^`` makes an exclude list, then a leading ``=`` makes the tokens exact names; tokens
are split on ``,`` with NO whitespace trimming (``"eth0, eth1"`` holds the prefix ``" eth1"``,
which never matches); without ``=`` a token is a prefix (``eth`` matches ``eth10``); ``:N`` after
a token is a port (used by ``NCCL_IB_HCA``); at most 16 tokens are read.
"""

from __future__ import annotations

from dataclasses import dataclass

#: NCCL's MAX_IFS: tokens read from a list, and interfaces used by the socket transport.
MAX_IFS = 16


@dataclass(frozen=True)
class IfToken:
    """One list entry: a name (prefix unless the list is exact) and a port (-1: any)."""

    name: str
    port: int = -1


@dataclass(frozen=True)
class IfList:
    """A parsed NCCL list (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``).

    Attributes:
        tokens: the entries, in the order written, at most 16.
        exclude: the list started with ``^``: match everything the tokens do not.
        exact: ``=`` followed (after any ``^``): tokens are whole names, not prefixes.
        dropped: tokens past the 16th, which NCCL never reads.
    """

    tokens: tuple[IfToken, ...]
    exclude: bool = False
    exact: bool = False
    dropped: int = 0

    def matches(self, name: str, port: int = -1) -> bool:
        """True when NCCL would select ``name`` (and ``port``) with this list.

        NCCL's ``matchIfList(...) ^ searchNot``: an empty token list matches everything, so an
        exclude list of nothing excludes everything.
        """
        return _match_any(name, port, self) != self.exclude

    @property
    def whitespace_tokens(self) -> tuple[str, ...]:
        """Tokens with spaces or tabs in them: NCCL keeps them, so they almost never match."""
        return tuple(t.name for t in self.tokens if t.name != t.name.strip()
                     or any(c.isspace() for c in t.name))


def _atoi(text: str) -> int:
    """C ``atoi``: optional blanks and sign, then digits; 0 when there are none."""
    i = 0
    while i < len(text) and text[i] in " \t\n\v\f\r":
        i += 1
    sign = 1
    if i < len(text) and text[i] in "+-":
        sign = -1 if text[i] == "-" else 1
        i += 1
    j = i
    while j < len(text) and text[j] in "0123456789":
        j += 1
    return sign * int(text[i:j]) if j > i else 0


def parse_if_list(value: str) -> IfList:
    """Parse an NCCL interface or HCA list exactly as NCCL does (see the module docstring).

    ``parse_if_list("^=docker0,lo")`` -> exclude, exact, tokens docker0 and lo. Empty tokens
    (``"eth0,,eth1"``) and tokens that are only a port (``":1"``) are skipped, as in NCCL.
    """
    exclude = value.startswith("^")
    if exclude:
        value = value[1:]
    exact = value.startswith("=")
    if exact:
        value = value[1:]
    tokens: list[IfToken] = []
    dropped = 0
    for raw in value.split(","):
        name, colon, rest = raw.partition(":")
        if not name:
            continue
        if len(tokens) >= MAX_IFS:
            dropped += 1
            continue
        tokens.append(IfToken(name, _atoi(rest) if colon else -1))
    return IfList(tuple(tokens), exclude=exclude, exact=exact, dropped=dropped)


def _match_any(name: str, port: int, spec: IfList) -> bool:
    if not spec.tokens:
        return True
    for tok in spec.tokens:
        hit = name == tok.name if spec.exact else name.startswith(tok.name)
        if hit and (tok.port == -1 or port in (-1, tok.port)):
            return True
    return False
