"""Kubernetes label selectors (the ``podSelector`` trigger key): parsed and matched as
``kubectl -l`` and ``k8s.io/apimachinery/pkg/labels.Parse`` do.

A selector is requirements separated by commas (a comma inside ``( ... )`` belongs to the
set); every requirement must hold:

    =========================  =====================================================
    ``k=v``, ``k==v``          ``k`` is present and equals ``v``
    ``k!=v``                   ``k`` is absent, or present with another value
    ``k in (a,b)``             ``k`` is present with one of the values
    ``k notin (a,b)``          ``k`` is absent, or present with none of the values
    ``k``                      ``k`` is present
    ``!k``                     ``k`` is absent
    ``k>N``, ``k<N``           ``k`` is present, its value is an integer, and compares
    =========================  =====================================================

Spaces, tabs and line breaks may surround any token. A key is ``[prefix/]name``: the prefix
a DNS subdomain (lowercase, at most 253 characters), the name at most 63 letters, digits,
``-``, ``_`` or ``.``, starting and ending with a letter or digit. A value is empty or made
like a name; ``k=`` asks for the empty value, and so does an empty member of a set
(``k in (a,)``, or ``k in (,)`` for the empty value alone). ``N`` is digits, as a label
value must be, within 64-bit range.

Where this parser differs from ``labels.Parse``, on purpose:

- the empty selector is refused (Kubernetes reads it as "everything"): leave the key out;
- ``in ()`` and ``notin ()`` are refused (Kubernetes reads them as the set of the empty
  value, which is rarely what was meant);
- a NUL character is refused (Go's lexer stops reading there).

Parsing canonicalizes, so that two spellings of one selector compare and hash equal:
``==`` becomes ``=``, values are sorted and deduplicated, ``N`` loses its leading zeros,
and requirements are sorted by key, then operator, then values, duplicates dropped.
``str()`` gives the canonical text, which parses back to an equal selector.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence

import msgspec

from keda_gpu_scaler.domain.errors import InvalidTrigger

__all__ = ["LabelSelector", "Operator", "Requirement", "parse_selector"]

_WHITESPACE = frozenset(" \t\r\n")
_SPECIAL = frozenset("=!(),<>")
_DELIMITERS = _WHITESPACE | _SPECIAL
_TWO_CHAR_SYMBOLS = frozenset({"==", "!="})
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_NAME_CHARS = _ALNUM | frozenset("-_.")
_DNS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")
_DNS_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_DIGITS = frozenset("0123456789")
_NAME_MAX = 63
_PREFIX_MAX = 253
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_OPERATORS_HELP = "=, ==, !=, in, notin, > or <"


class Operator(enum.StrEnum):
    """A requirement's operator; the values are Kubernetes' ``selection.Operator`` names."""

    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    GREATER_THAN = "gt"
    LESS_THAN = "lt"


_RANK = {op: rank for rank, op in enumerate(Operator)}
_EXACT = {"=": Operator.EQUALS, "==": Operator.EQUALS, "!=": Operator.NOT_EQUALS}
_COMPARE = {">": Operator.GREATER_THAN, "<": Operator.LESS_THAN}
_SETS = {"in": Operator.IN, "notin": Operator.NOT_IN}
_SYMBOL = {Operator.GREATER_THAN: ">", Operator.LESS_THAN: "<"}


class Requirement(msgspec.Struct, frozen=True):
    """One requirement; ``values`` is sorted (one value for ``=``, ``!=``, ``>``, ``<``)."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case Operator.EXISTS:
                return value is not None
            case Operator.DOES_NOT_EXIST:
                return value is None
            case Operator.EQUALS | Operator.IN:
                return value is not None and value in self.values
            case Operator.NOT_EQUALS | Operator.NOT_IN:
                return value is None or value not in self.values
            case _:
                return value is not None and self._compares(value)

    def _compares(self, value: str) -> bool:
        number = _go_parse_int(value)
        if number is None:
            return False
        if self.operator is Operator.GREATER_THAN:
            return number > int(self.values[0])
        return number < int(self.values[0])

    def __str__(self) -> str:
        match self.operator:
            case Operator.EXISTS:
                return self.key
            case Operator.DOES_NOT_EXIST:
                return f"!{self.key}"
            case Operator.EQUALS | Operator.NOT_EQUALS:
                return f"{self.key}{self.operator}{self.values[0]}"
            case Operator.IN | Operator.NOT_IN:
                # "()" is refused, so the set of the empty value alone is written "(,)".
                members = "," if self.values == ("",) else ",".join(self.values)
                return f"{self.key} {self.operator} ({members})"
            case _:
                return f"{self.key}{_SYMBOL[self.operator]}{self.values[0]}"


class LabelSelector(msgspec.Struct, frozen=True):
    """Requirements that must all hold, in canonical order (see ``parse_selector``)."""

    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(requirement) for requirement in self.requirements)


class _Bad(Exception):
    """What is wrong with one requirement; ``parse_selector`` says which one."""


def parse_selector(raw: str, *, key: str = "podSelector") -> LabelSelector:
    """Parse ``raw``; any problem raises ``InvalidTrigger(key, raw, reason)``."""
    if all(char in _WHITESPACE for char in raw):
        raise InvalidTrigger(key, raw, "the selector is empty; leave the key out to mean every GPU")
    chunks = _split_requirements(raw)
    requirements = []
    for number, chunk in enumerate(chunks, start=1):
        try:
            requirements.append(_parse_requirement(chunk))
        except _Bad as exc:
            raise InvalidTrigger(key, raw, _where(number, chunk, len(chunks), str(exc))) from None
    ordered = sorted(set(requirements), key=_canonical_order)
    return LabelSelector(tuple(ordered))


def _canonical_order(requirement: Requirement) -> tuple[str, int, tuple[str, ...]]:
    return requirement.key, _RANK[requirement.operator], requirement.values


def _where(number: int, chunk: str, count: int, reason: str) -> str:
    text = chunk.strip("".join(_WHITESPACE))
    if text:
        return f"requirement {number} {json.dumps(text)}: {reason}"
    if number == 1:
        return "requirement 1 is empty (a comma at the start)"
    if number == count:
        return f"requirement {number} is empty (a comma at the end)"
    return f"requirement {number} is empty (two commas in a row)"


def _split_requirements(raw: str) -> list[str]:
    """Split at the commas outside ``( ... )``."""
    chunks: list[str] = []
    start, in_set = 0, False
    for index, char in enumerate(raw):
        if char == "(":
            in_set = True
        elif char == ")":
            in_set = False
        elif char == "," and not in_set:
            chunks.append(raw[start:index])
            start = index + 1
    chunks.append(raw[start:])
    return chunks


def _tokens(text: str) -> list[str]:
    """Go's lexer: each special symbol alone (``==`` and ``!=`` as one), and identifiers
    (runs of anything else up to whitespace or a special symbol)."""
    tokens: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char in _WHITESPACE:
            index += 1
        elif char in _SPECIAL:
            width = 2 if text[index : index + 2] in _TWO_CHAR_SYMBOLS else 1
            tokens.append(text[index : index + width])
            index += width
        else:
            end = index
            while end < len(text) and text[end] not in _DELIMITERS:
                end += 1
            tokens.append(text[index:end])
            index = end
    return tokens


def _is_symbol(token: str) -> bool:
    return token[0] in _SPECIAL


def _found(tokens: Sequence[str]) -> str:
    return f"found {json.dumps(tokens[0])}" if tokens else "found nothing"


def _parse_requirement(chunk: str) -> Requirement:
    tokens = _tokens(chunk)
    if not tokens:
        raise _Bad("empty")  # _where says where the stray comma is
    if tokens[0] == "!":
        return _parse_does_not_exist(tokens[1:])
    key = _parse_key(tokens[0])
    if len(tokens) == 1:
        return Requirement(key, Operator.EXISTS)
    operator, rest = tokens[1], tokens[2:]
    if operator in _EXACT:
        return Requirement(key, _EXACT[operator], (_parse_exact_value(operator, rest),))
    if operator in _COMPARE:
        return Requirement(key, _COMPARE[operator], (_parse_integer(operator, rest),))
    if operator in _SETS:
        return Requirement(key, _SETS[operator], _parse_set(operator, rest))
    raise _Bad(
        f"expected an operator ({_OPERATORS_HELP}) or the end after key {json.dumps(key)}, "
        f"found {json.dumps(operator)}"
    )


def _parse_does_not_exist(tokens: Sequence[str]) -> Requirement:
    if not tokens:
        raise _Bad('expected a key after "!"')
    key = _parse_key(tokens[0])
    if len(tokens) > 1:
        raise _Bad(f'"!" takes a key alone ("!{key}"), found {json.dumps(tokens[1])} after the key')
    return Requirement(key, Operator.DOES_NOT_EXIST)


def _parse_key(token: str) -> str:
    if _is_symbol(token):
        raise _Bad(f"expected a key, found {json.dumps(token)}")
    problem = _key_problem(token)
    if problem is not None:
        raise _Bad(f"key {json.dumps(token)}: {problem}")
    return token


def _parse_exact_value(operator: str, tokens: Sequence[str]) -> str:
    if not tokens:
        return ""
    value = tokens[0]
    if _is_symbol(value):
        raise _Bad(f"expected a value (or the end) after {json.dumps(operator)}, {_found(tokens)}")
    if len(tokens) > 1:
        raise _Bad(f"expected the end after value {json.dumps(value)}, {_found(tokens[1:])}")
    _check_value(value)
    return value


def _parse_integer(operator: str, tokens: Sequence[str]) -> str:
    if not tokens or _is_symbol(tokens[0]) or not set(tokens[0]) <= _DIGITS:
        raise _Bad(f"{json.dumps(operator)} needs an integer made of digits, {_found(tokens)}")
    value = tokens[0]
    if len(tokens) > 1:
        raise _Bad(f"expected the end after value {json.dumps(value)}, {_found(tokens[1:])}")
    _check_value(value)
    if int(value) > _INT64_MAX:
        raise _Bad(f"integer {json.dumps(value)} is out of range (at most {_INT64_MAX})")
    return str(int(value))


def _parse_set(operator: str, tokens: Sequence[str]) -> tuple[str, ...]:
    if not tokens or tokens[0] != "(":
        raise _Bad(f'expected "(" after {json.dumps(operator)}, {_found(tokens)}')
    if ")" not in tokens:
        raise _Bad('missing ")"')
    close = tokens.index(")")
    inside = tokens[1:close]
    if not inside:
        raise _Bad(
            f'"{operator} ()" has no values; list at least one (an empty member, as in '
            '"(,)", stands for the empty value)'
        )
    values = {_parse_member(member) for member in _members(inside)}
    if close + 1 < len(tokens):
        raise _Bad(f'expected the end after ")", {_found(tokens[close + 1 :])}')
    return tuple(sorted(values))


def _members(tokens: Sequence[str]) -> list[list[str]]:
    members: list[list[str]] = [[]]
    for token in tokens:
        if token == ",":
            members.append([])
        else:
            members[-1].append(token)
    return members


def _parse_member(tokens: Sequence[str]) -> str:
    if not tokens:
        return ""
    symbol = next((token for token in tokens if _is_symbol(token)), None)
    if symbol is not None:
        raise _Bad(f"unexpected {json.dumps(symbol)} inside the parentheses")
    if len(tokens) > 1:
        first, second = (json.dumps(token) for token in tokens[:2])
        raise _Bad(f'expected "," or ")" between {first} and {second}')
    _check_value(tokens[0])
    return tokens[0]


def _check_value(value: str) -> None:
    problem = _name_problem(value, "it")
    if problem is not None:
        raise _Bad(f"value {json.dumps(value)}: {problem}")


def _key_problem(key: str) -> str | None:
    if key.count("/") > 1:
        return 'more than one "/"; a key is a name with an optional DNS subdomain prefix and "/"'
    prefix, slash, name = key.rpartition("/")
    if slash:
        problem = _prefix_problem(prefix)
        if problem is not None:
            return problem
        if not name:
            return 'the name after "/" is empty'
    return _name_problem(name, "the name")


def _prefix_problem(prefix: str) -> str | None:
    if not prefix:
        return 'the prefix before "/" is empty'
    if len(prefix) > _PREFIX_MAX:
        return f"the prefix is {len(prefix)} characters long; at most {_PREFIX_MAX}"
    rule = (
        "a DNS subdomain: lowercase letters, digits, '-' and '.', each dot-separated part "
        "starting and ending with a letter or digit"
    )
    bad = _first_outside(prefix, _DNS_CHARS)
    if bad is not None:
        return f"the prefix contains {json.dumps(bad)}; it must be {rule}"
    for part in prefix.split("."):
        if not part or part[0] not in _DNS_ALNUM or part[-1] not in _DNS_ALNUM:
            return f"the prefix {json.dumps(prefix)} must be {rule}"
    return None


def _name_problem(text: str, what: str) -> str | None:
    """The rule shared by a key's name and a value (which may also be empty)."""
    if not text:
        return None
    if len(text) > _NAME_MAX:
        return f"{what} is {len(text)} characters long; at most {_NAME_MAX}"
    bad = _first_outside(text, _NAME_CHARS)
    if bad is not None:
        return (
            f"{what} contains {json.dumps(bad)}; only letters, digits, '-', '_' and '.' are allowed"
        )
    if text[0] not in _ALNUM or text[-1] not in _ALNUM:
        return f"{what} must start and end with a letter or digit"
    return None


def _first_outside(text: str, allowed: frozenset[str]) -> str | None:
    return next((char for char in text if char not in allowed), None)


def _go_parse_int(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``: an optional sign, ASCII digits, 64-bit range."""
    sign, digits = (text[0], text[1:]) if text[:1] in ("+", "-") else ("", text)
    if not digits or not set(digits) <= _DIGITS:
        return None
    # Past 19 significant digits it is out of range, and int() refuses thousands of digits.
    significant = digits.lstrip("0") or "0"
    if len(significant) > 19:
        return None
    number = int(sign + significant)
    return number if _INT64_MIN <= number <= _INT64_MAX else None
