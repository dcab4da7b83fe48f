"""``podSelector``: Kubernetes label selectors parsed, canonicalized and matched."""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keda_gpu_scaler.domain.errors import InvalidTrigger
from keda_gpu_scaler.domain.selector import (
    LabelSelector,
    Operator,
    Requirement,
    parse_selector,
)
from tests.k8s_tools import run_tool, tool

INT64_MAX = (1 << 63) - 1


def _selector(*requirements: Requirement) -> LabelSelector:
    return LabelSelector(requirements)


def _reason(raw: str, *, key: str = "podSelector") -> str:
    with pytest.raises(InvalidTrigger) as caught:
        parse_selector(raw, key=key)
    error = caught.value
    assert error.key == key
    assert error.value == raw
    assert str(error) == f"invalid {key} {json.dumps(raw)}: {error.reason}"
    return error.reason


# --- parsing, operator by operator ---------------------------------------------------------

PARSED = [
    ("app=web", _selector(Requirement("app", Operator.EQUALS, ("web",)))),
    ("app==web", _selector(Requirement("app", Operator.EQUALS, ("web",)))),
    ("app = web", _selector(Requirement("app", Operator.EQUALS, ("web",)))),
    ("app=", _selector(Requirement("app", Operator.EQUALS, ("",)))),
    ("app!=web", _selector(Requirement("app", Operator.NOT_EQUALS, ("web",)))),
    ("app !=", _selector(Requirement("app", Operator.NOT_EQUALS, ("",)))),
    ("app in (b,a)", _selector(Requirement("app", Operator.IN, ("a", "b")))),
    ("app in(a)", _selector(Requirement("app", Operator.IN, ("a",)))),
    ("app in ( a , b , a )", _selector(Requirement("app", Operator.IN, ("a", "b")))),
    ("app in (a,)", _selector(Requirement("app", Operator.IN, ("", "a")))),
    ("app in (,)", _selector(Requirement("app", Operator.IN, ("",)))),
    ("app notin (x, y)", _selector(Requirement("app", Operator.NOT_IN, ("x", "y")))),
    ("app", _selector(Requirement("app", Operator.EXISTS))),
    ("!app", _selector(Requirement("app", Operator.DOES_NOT_EXIST))),
    ("! app", _selector(Requirement("app", Operator.DOES_NOT_EXIST))),
    ("rank>3", _selector(Requirement("rank", Operator.GREATER_THAN, ("3",)))),
    ("rank < 007", _selector(Requirement("rank", Operator.LESS_THAN, ("7",)))),
    ("rank>0", _selector(Requirement("rank", Operator.GREATER_THAN, ("0",)))),
    (f"rank<{INT64_MAX}", _selector(Requirement("rank", Operator.LESS_THAN, (str(INT64_MAX),)))),
    # "in" and "notin" are operators only where an operator is expected.
    ("in in (in,notin)", _selector(Requirement("in", Operator.IN, ("in", "notin")))),
    ("notin=in", _selector(Requirement("notin", Operator.EQUALS, ("in",)))),
    ("!notin", _selector(Requirement("notin", Operator.DOES_NOT_EXIST))),
    (
        "example.com/gpu-pool=a100,app.kubernetes.io/name in (vllm)",
        _selector(
            Requirement("app.kubernetes.io/name", Operator.IN, ("vllm",)),
            Requirement("example.com/gpu-pool", Operator.EQUALS, ("a100",)),
        ),
    ),
    (
        " \t app=x ,\n tier notin (b) \r\n",
        _selector(
            Requirement("app", Operator.EQUALS, ("x",)),
            Requirement("tier", Operator.NOT_IN, ("b",)),
        ),
    ),
    ("My_App.v2=Blue-1", _selector(Requirement("My_App.v2", Operator.EQUALS, ("Blue-1",)))),
    ("a..b=c__d", _selector(Requirement("a..b", Operator.EQUALS, ("c__d",)))),
]


@pytest.mark.parametrize(("raw", "expected"), PARSED)
def test_each_operator_parses(raw: str, expected: LabelSelector) -> None:
    assert parse_selector(raw) == expected


# --- matching, with absent keys ------------------------------------------------------------

WEB = {"app": "web", "tier": "front", "rank": "5", "empty": ""}
MATCHES = [
    ("app=web", WEB, True),
    ("app=db", WEB, False),
    ("missing=web", WEB, False),
    ("empty=", WEB, True),
    ("missing=", WEB, False),
    ("app!=db", WEB, True),
    ("app!=web", WEB, False),
    ("missing!=web", WEB, True),
    ("empty!=", WEB, False),
    ("app in (db,web)", WEB, True),
    ("app in (db,cache)", WEB, False),
    ("missing in (web)", WEB, False),
    ("empty in (a,)", WEB, True),
    ("app notin (db,cache)", WEB, True),
    ("app notin (db,web)", WEB, False),
    ("missing notin (web)", WEB, True),
    ("app", WEB, True),
    ("empty", WEB, True),
    ("missing", WEB, False),
    ("!missing", WEB, True),
    ("!app", WEB, False),
    ("!empty", WEB, False),
    ("rank>4", WEB, True),
    ("rank>5", WEB, False),
    ("rank<6", WEB, True),
    ("rank<5", WEB, False),
    ("missing>0", WEB, False),
    ("missing<9", WEB, False),
    ("app>0", WEB, False),
    ("app<9", WEB, False),
    ("empty<9", WEB, False),
    ("app=web,tier=front", WEB, True),
    ("app=web,tier=back", WEB, False),
    ("app=web,!missing,rank>1,tier notin (back)", WEB, True),
    ("app", {}, False),
    ("!app", {}, True),
    ("app notin (a)", {}, True),
]


@pytest.mark.parametrize(("raw", "labels", "expected"), MATCHES)
def test_matching(raw: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_selector(raw).matches(labels) is expected


@pytest.mark.parametrize(
    ("label", "above_four"),
    [
        ("5", True),
        ("+5", True),
        ("0005", True),
        ("-5", False),
        ("4", False),
        (str(INT64_MAX), True),
        (str(INT64_MAX + 1), False),  # out of 64-bit range: not an integer to Kubernetes
        ("-9223372036854775808", False),
        ("-9223372036854775809", False),
        ("5.0", False),
        ("0x10", False),
        ("1_000", False),
        (" 5", False),
        ("５", False),  # a full-width digit is not an ASCII digit
        ("+", False),
        ("", False),
        ("9" * 5000, False),  # far beyond int()'s default digit limit, and no crash
        ("0" * 5000 + "7", True),
    ],
)
def test_comparisons_read_label_values_as_go_parses_int64(label: str, above_four: bool) -> None:
    assert parse_selector("n>4").matches({"n": label}) is above_four


def test_less_than_reaches_the_int64_minimum() -> None:
    assert parse_selector("n<0").matches({"n": "-9223372036854775808"})
    assert not parse_selector("n<0").matches({"n": "-9223372036854775809"})


# --- canonical form ------------------------------------------------------------------------


def test_two_spellings_of_one_selector_are_equal_and_hash_equal() -> None:
    one = parse_selector("app=x,tier in (b,a)")
    other = parse_selector("tier in (a,b), app==x")
    assert one == other
    assert hash(one) == hash(other)
    assert len({one, other}) == 1
    assert str(one) == str(other) == "app=x,tier in (a,b)"


def test_different_selectors_differ() -> None:
    assert parse_selector("app=x") != parse_selector("app!=x")
    assert parse_selector("app in (a)") != parse_selector("app notin (a)")
    assert parse_selector("app in (a)") != parse_selector("app in (a,b)")
    assert parse_selector("app>1") != parse_selector("app<1")
    assert parse_selector("app") != parse_selector("!app")


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("b=1,a=2", "a=2,b=1"),
        ("a==1", "a=1"),
        ("a = 1", "a=1"),
        ("a=", "a="),
        ("a != x", "a!=x"),
        ("a in ( c, b ,a )", "a in (a,b,c)"),
        ("a notin (c,b)", "a notin (b,c)"),
        ("a in (x,,)", "a in (,x)"),
        ("a in (,)", "a in (,)"),
        ("! a", "!a"),
        ("a >  0042", "a>42"),
        ("a<00", "a<0"),
        ("a=1,a=1", "a=1"),
        ("a==1, a=1", "a=1"),
        # Within one key: exists, !, =, !=, in, notin, >, <; then by values.
        (
            "a<9,a>1,a notin (x),a in (y),a!=z,a=w,!a,a",
            "a,!a,a=w,a!=z,a in (y),a notin (x),a>1,a<9",
        ),
        ("a!=y,a!=x", "a!=x,a!=y"),
        ("z, x.io/a, a", "a,x.io/a,z"),
    ],
)
def test_canonical_text(raw: str, canonical: str) -> None:
    selector = parse_selector(raw)
    assert str(selector) == canonical
    assert parse_selector(canonical) == selector


def test_requirements_and_operators_print_alone() -> None:
    assert str(Requirement("app", Operator.IN, ("a", "b"))) == "app in (a,b)"
    assert str(Requirement("app", Operator.GREATER_THAN, ("3",))) == "app>3"
    assert str(Requirement("app", Operator.DOES_NOT_EXIST)) == "!app"
    assert Operator("notin") is Operator.NOT_IN


class _Spec(msgspec.Struct, frozen=True):
    pods: LabelSelector | None = None


def test_a_selector_is_a_field_of_a_frozen_hashed_struct_and_survives_msgspec() -> None:
    spec = _Spec(parse_selector("app=web,rank>2"))
    assert hash(spec) == hash(_Spec(parse_selector("rank > 2, app == web")))
    assert spec == _Spec(parse_selector("rank > 2, app == web"))
    decoded = msgspec.json.decode(msgspec.json.encode(spec), type=_Spec)
    assert decoded == spec
    with pytest.raises(AttributeError):
        spec.pods.requirements = ()  # type: ignore[misc, union-attr]


# --- errors --------------------------------------------------------------------------------


def test_the_message_names_the_key_the_value_and_the_requirement() -> None:
    with pytest.raises(InvalidTrigger) as caught:
        parse_selector("app=x,app in (a")
    assert str(caught.value) == (
        'invalid podSelector "app=x,app in (a": requirement 2 "app in (a": missing ")"'
    )


def test_the_trigger_key_is_the_callers() -> None:
    assert _reason("a b", key="otherSelector").startswith('requirement 1 "a b"')


@pytest.mark.parametrize("raw", ["", " ", "\t\r\n "])
def test_the_empty_selector_is_refused(raw: str) -> None:
    assert _reason(raw) == "the selector is empty; leave the key out to mean every GPU"


ERRORS = [
    # empty requirements
    (",a", "requirement 1 is empty (a comma at the start)"),
    ("a,", "requirement 2 is empty (a comma at the end)"),
    ("a, ", "requirement 2 is empty (a comma at the end)"),
    ("a,,b", "requirement 2 is empty (two commas in a row)"),
    (",", "requirement 1 is empty (a comma at the start)"),
    # keys
    ("=b", 'requirement 1 "=b": expected a key, found "="'),
    ("!", 'requirement 1 "!": expected a key after "!"'),
    ("!=x", 'requirement 1 "!=x": expected a key, found "!="'),
    ("(a)", 'requirement 1 "(a)": expected a key, found "("'),
    ("!!a", 'requirement 1 "!!a": expected a key, found "!"'),
    (
        "a@b=c",
        'requirement 1 "a@b=c": key "a@b": the name contains "@"; '
        "only letters, digits, '-', '_' and '.' are allowed",
    ),
    ("-a", 'requirement 1 "-a": key "-a": the name must start and end with a letter or digit'),
    ("a.", 'requirement 1 "a.": key "a.": the name must start and end with a letter or digit'),
    ("/a", 'requirement 1 "/a": key "/a": the prefix before "/" is empty'),
    ("x.io/", 'requirement 1 "x.io/": key "x.io/": the name after "/" is empty'),
    (
        "a/b/c",
        'requirement 1 "a/b/c": key "a/b/c": more than one "/"; '
        'a key is a name with an optional DNS subdomain prefix and "/"',
    ),
    (
        "Ex.com/a",
        'requirement 1 "Ex.com/a": key "Ex.com/a": the prefix contains "E"; it must be a DNS '
        "subdomain: lowercase letters, digits, '-' and '.', each dot-separated part starting "
        "and ending with a letter or digit",
    ),
    (
        "ex_a.com/a",
        'requirement 1 "ex_a.com/a": key "ex_a.com/a": the prefix contains "_"; it must be a DNS '
        "subdomain: lowercase letters, digits, '-' and '.', each dot-separated part starting "
        "and ending with a letter or digit",
    ),
    (
        "ex..com/a",
        'requirement 1 "ex..com/a": key "ex..com/a": the prefix "ex..com" must be a DNS '
        "subdomain: lowercase letters, digits, '-' and '.', each dot-separated part starting "
        "and ending with a letter or digit",
    ),
    (
        "-ex.com/a",
        'requirement 1 "-ex.com/a": key "-ex.com/a": the prefix "-ex.com" must be a DNS '
        "subdomain: lowercase letters, digits, '-' and '.', each dot-separated part starting "
        "and ending with a letter or digit",
    ),
    (
        "ex.com-/a",
        'requirement 1 "ex.com-/a": key "ex.com-/a": the prefix "ex.com-" must be a DNS '
        "subdomain: lowercase letters, digits, '-' and '.', each dot-separated part starting "
        "and ending with a letter or digit",
    ),
    (
        "é=1",
        'requirement 1 "\\u00e9=1": key "\\u00e9": the name contains "\\u00e9"; '
        "only letters, digits, '-', '_' and '.' are allowed",
    ),
    (
        "a\x00b",
        'requirement 1 "a\\u0000b": key "a\\u0000b": the name contains "\\u0000"; '
        "only letters, digits, '-', '_' and '.' are allowed",
    ),
    # operators
    (
        "a b",
        'requirement 1 "a b": expected an operator (=, ==, !=, in, notin, > or <) or the end '
        'after key "a", found "b"',
    ),
    (
        "a)",
        'requirement 1 "a)": expected an operator (=, ==, !=, in, notin, > or <) or the end '
        'after key "a", found ")"',
    ),
    (
        "a IN (b)",
        'requirement 1 "a IN (b)": expected an operator (=, ==, !=, in, notin, > or <) or the '
        'end after key "a", found "IN"',
    ),
    (
        "ain(b)",
        'requirement 1 "ain(b)": expected an operator (=, ==, !=, in, notin, > or <) or the '
        'end after key "ain", found "("',
    ),
    ("!a=b", 'requirement 1 "!a=b": "!" takes a key alone ("!a"), found "=" after the key'),
    (
        "!a in (b)",
        'requirement 1 "!a in (b)": "!" takes a key alone ("!a"), found "in" after the key',
    ),
    # exact values
    ("a!==b", 'requirement 1 "a!==b": expected a value (or the end) after "!=", found "="'),
    ("a=(b)", 'requirement 1 "a=(b)": expected a value (or the end) after "=", found "("'),
    ("a=b c", 'requirement 1 "a=b c": expected the end after value "b", found "c"'),
    ("a=b=c", 'requirement 1 "a=b=c": expected the end after value "b", found "="'),
    (
        "a=-b",
        'requirement 1 "a=-b": value "-b": it must start and end with a letter or digit',
    ),
    (
        "a=b/c",
        'requirement 1 "a=b/c": value "b/c": it contains "/"; '
        "only letters, digits, '-', '_' and '.' are allowed",
    ),
    # sets
    ("a in b", 'requirement 1 "a in b": expected "(" after "in", found "b"'),
    ("a notin", 'requirement 1 "a notin": expected "(" after "notin", found nothing'),
    ("a in (b", 'requirement 1 "a in (b": missing ")"'),
    ("a in (b, c=d", 'requirement 1 "a in (b, c=d": missing ")"'),
    ("a in (b) c", 'requirement 1 "a in (b) c": expected the end after ")", found "c"'),
    ("a in (b))", 'requirement 1 "a in (b))": expected the end after ")", found ")"'),
    ("a in (b c)", 'requirement 1 "a in (b c)": expected "," or ")" between "b" and "c"'),
    ("a in (b=)", 'requirement 1 "a in (b=)": unexpected "=" inside the parentheses'),
    ("a in ((b))", 'requirement 1 "a in ((b))": unexpected "(" inside the parentheses'),
    (
        "a in ()",
        'requirement 1 "a in ()": "in ()" has no values; list at least one (an empty member, '
        'as in "(,)", stands for the empty value)',
    ),
    (
        "a notin ( )",
        'requirement 1 "a notin ( )": "notin ()" has no values; list at least one (an empty '
        'member, as in "(,)", stands for the empty value)',
    ),
    (
        "a in (b,-c)",
        'requirement 1 "a in (b,-c)": value "-c": it must start and end with a letter or digit',
    ),
    # integers
    ("a>", 'requirement 1 "a>": ">" needs an integer made of digits, found nothing'),
    ("a<b", 'requirement 1 "a<b": "<" needs an integer made of digits, found "b"'),
    ("a>-1", 'requirement 1 "a>-1": ">" needs an integer made of digits, found "-1"'),
    ("a>+1", 'requirement 1 "a>+1": ">" needs an integer made of digits, found "+1"'),
    ("a>1.5", 'requirement 1 "a>1.5": ">" needs an integer made of digits, found "1.5"'),
    ("a>=1", 'requirement 1 "a>=1": ">" needs an integer made of digits, found "="'),
    ("a<>1", 'requirement 1 "a<>1": "<" needs an integer made of digits, found ">"'),
    ("a>１", 'requirement 1 "a>\\uff11": ">" needs an integer made of digits, found "\\uff11"'),
    ("a>1 2", 'requirement 1 "a>1 2": expected the end after value "1", found "2"'),
    (
        f"a>{INT64_MAX + 1}",
        f'requirement 1 "a>{INT64_MAX + 1}": integer "{INT64_MAX + 1}" is out of range '
        f"(at most {INT64_MAX})",
    ),
    # the failing requirement is named among others
    (
        "app=x, tier in (a b), !c",
        'requirement 2 "tier in (a b)": expected "," or ")" between "a" and "b"',
    ),
    (
        "a,b,c,d e",
        'requirement 4 "d e": expected an operator (=, ==, !=, in, notin, > or <) or the end '
        'after key "d", found "e"',
    ),
]


@pytest.mark.parametrize(("raw", "reason"), ERRORS)
def test_errors_say_what_is_wrong_and_where(raw: str, reason: str) -> None:
    assert _reason(raw) == reason


# --- limits ---------------------------------------------------------------------------------

NAME_63 = "n" + "a" * 61 + "z"
PREFIX_253 = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])


def test_the_limits_are_exact() -> None:
    assert len(NAME_63) == 63
    assert len(PREFIX_253) == 253
    assert parse_selector(f"{NAME_63}={NAME_63}") == _selector(
        Requirement(NAME_63, Operator.EQUALS, (NAME_63,))
    )
    long_key = f"{PREFIX_253}/{NAME_63}"
    assert str(parse_selector(f"{long_key} in ({NAME_63})")) == f"{long_key} in ({NAME_63})"


def test_a_name_one_over_the_limit() -> None:
    name = NAME_63 + "x"
    assert _reason(name).endswith(f'key "{name}": the name is 64 characters long; at most 63')
    assert _reason(f"x.io/{name}").endswith("the name is 64 characters long; at most 63")


def test_a_value_one_over_the_limit() -> None:
    value = NAME_63 + "x"
    for raw in (f"a={value}", f"a!={value}", f"a in (b,{value})", f"a notin ({value})"):
        assert _reason(raw).endswith(f'value "{value}": it is 64 characters long; at most 63')


def test_a_prefix_one_over_the_limit() -> None:
    prefix = PREFIX_253 + "e"
    assert _reason(f"{prefix}/a").endswith("the prefix is 254 characters long; at most 253")


def test_an_integer_is_a_label_value_too() -> None:
    sixty_four_digits = "0" * 63 + "1"
    assert parse_selector(f"a>{sixty_four_digits[1:]}") == parse_selector("a>1")
    assert _reason(f"a>{sixty_four_digits}").endswith("it is 64 characters long; at most 63")


# --- properties -----------------------------------------------------------------------------

SELECTORISH = "ab/.-_=!(),<> \t\n01in"
TOKENS = [
    "a", "b", "x.io/a", "A", "in", "notin", "=", "==", "!=", "!", "(", ")", ",", ">", "<",
    "1", "007", "-1", " ", "\t", "", "a-", "_a", "/", "é", "\x00",
]  # fmt: skip


def _parse_or_refuse(raw: str) -> LabelSelector | None:
    """The only two outcomes allowed for any text."""
    try:
        selector = parse_selector(raw)
    except InvalidTrigger as exc:
        assert exc.key == "podSelector"
        assert exc.value == raw
        assert json.dumps(raw) in str(exc)
        assert exc.reason
        return None
    assert parse_selector(str(selector)) == selector
    return selector


@settings(max_examples=500)
@given(st.text())
def test_any_text_parses_or_is_refused(raw: str) -> None:
    _parse_or_refuse(raw)


@settings(max_examples=1000)
@given(st.text(alphabet=SELECTORISH, max_size=30))
def test_selectorish_text_parses_or_is_refused(raw: str) -> None:
    _parse_or_refuse(raw)


@settings(max_examples=1000)
@given(st.lists(st.sampled_from(TOKENS), max_size=12).map("".join))
def test_token_soup_parses_or_is_refused(raw: str) -> None:
    _parse_or_refuse(raw)


_NAMES = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,6}[A-Za-z0-9])?", fullmatch=True)
_PREFIXES = st.from_regex(
    r"[a-z0-9]([-a-z0-9]{0,3}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,3}[a-z0-9])?){0,2}",
    fullmatch=True,
)
_KEYS = st.one_of(
    _NAMES, st.tuples(_PREFIXES, _NAMES).map("/".join), st.sampled_from(["in", "notin", "a"])
)
_VALUES = st.one_of(st.just(""), _NAMES, st.sampled_from(["in", "notin", "a"]))
_WS = st.sampled_from(["", " ", "\t", "  ", "\n", "\r\n"])
_GAP = st.sampled_from([" ", "\t", "\n", "  "])  # between a key and "in" / "notin"

# One generated requirement: (key, operator as written, values, rendered text).
_Generated = tuple[str, str, tuple[str, ...], str]


@st.composite
def _requirements(draw: st.DrawFn) -> _Generated:
    key = draw(_KEYS)
    written = draw(st.sampled_from(["", "!", "=", "==", "!=", "in", "notin", ">", "<"]))
    if written in ("", "!"):
        return key, written, (), f"{draw(_WS)}{written}{draw(_WS)}{key}{draw(_WS)}"
    if written in (">", "<"):
        number = draw(st.integers(0, INT64_MAX))
        text = "0" * draw(st.integers(0, 3)) + str(number)
        return key, written, (str(number),), f"{key}{draw(_WS)}{written}{draw(_WS)}{text}"
    if written in ("=", "==", "!="):
        value = draw(_VALUES)
        return key, written, (value,), f"{key}{draw(_WS)}{written}{draw(_WS)}{value}{draw(_WS)}"
    members = draw(st.lists(_VALUES, min_size=1, max_size=4))
    body = "," if members == [""] else ",".join(f"{draw(_WS)}{m}{draw(_WS)}" for m in members)
    return key, written, tuple(members), f"{key}{draw(_GAP)}{written}{draw(_WS)}({body})"


def _oracle(generated: list[_Generated], labels: Mapping[str, str]) -> bool:
    """Kubernetes' semantics, written out again from the generated parts."""
    results = []
    for key, written, values, _ in generated:
        present, value = key in labels, labels.get(key)
        if written == "":
            results.append(present)
        elif written == "!":
            results.append(not present)
        elif written in ("=", "==", "in"):
            results.append(present and value in values)
        elif written in ("!=", "notin"):
            results.append(not present or value not in values)
        else:
            number = _int64(value)
            limit = int(values[0])
            results.append(
                number is not None and (number > limit if written == ">" else number < limit)
            )
    return all(results)


def _int64(text: str | None) -> int | None:
    if text is None:
        return None
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or not body.isascii() or not body.isdigit():
        return None
    significant = body.lstrip("0") or "0"
    number = int(text[: len(text) - len(body)] + significant) if len(significant) <= 20 else 1 << 64
    return number if -(1 << 63) <= number < (1 << 63) else None


_LABEL_VALUES = st.one_of(
    _VALUES,
    st.integers(-(1 << 64), 1 << 64).map(str),
    st.sampled_from(["+5", "-0", "007", "", "x"]),
    st.text(max_size=5),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_requirements(), min_size=1, max_size=5), st.data())
def test_valid_selectors_parse_canonically_and_match_as_kubernetes(
    generated: list[_Generated], data: st.DataObject
) -> None:
    texts = [text for *_, text in generated]
    selector = parse_selector(",".join(texts))
    shuffled = data.draw(st.permutations(texts))
    assert parse_selector(",".join(shuffled)) == selector
    assert hash(parse_selector(",".join(shuffled))) == hash(selector)
    assert parse_selector(str(selector)) == selector
    requirements = selector.requirements
    assert len(set(requirements)) == len(requirements)
    assert {r.key for r in requirements} == {key for key, *_ in generated}
    assert all(list(r.values) == sorted(set(r.values)) for r in requirements)
    keys = [key for key, *_ in generated]
    labels = data.draw(
        st.dictionaries(st.one_of(st.sampled_from(keys), _KEYS), _LABEL_VALUES, max_size=6)
    )
    assert selector.matches(labels) is _oracle(generated, labels)


@given(
    st.lists(_requirements(), min_size=1, max_size=3),
    st.dictionaries(st.text(max_size=8), st.text(max_size=25), max_size=6),
)
def test_matching_is_total(generated: list[_Generated], labels: dict[str, str]) -> None:
    selector = parse_selector(",".join(text for *_, text in generated))
    assert isinstance(selector.matches(labels), bool)
    assert selector.matches(labels) is _oracle(generated, labels)


# --- the reference: kubectl's own parser ------------------------------------------------------

# Where this parser refuses on purpose what labels.Parse accepts; everything else agrees.
DELIBERATELY_STRICTER = ["", " ", "a in ()", "a notin ( )"]


def _kubectl_parses(raw: str, tmp: Path) -> bool:
    # `set selector --local` runs labels.Parse and stops before any server is asked; a set
    # or a comparison the Service cannot hold fails later, with another message.
    command: list[str | Path] = [
        tool("kubectl"),
        "set",
        "selector",
        "--local",
        "-f",
        tmp / "svc.yaml",
        "-o",
    ]
    result = run_tool([*command, "name", "--", raw], tmp)
    return "couldn't parse" not in result.stderr


@pytest.mark.slow
def test_kubectl_accepts_exactly_what_this_parser_accepts(tmp_path: Path) -> None:
    (tmp_path / "svc.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 80}]}\n"
    )
    every = [raw for raw, _ in PARSED] + [raw for raw, _ in ERRORS if "\x00" not in raw]
    cases = sorted({*every, *(raw for raw, _, _ in MATCHES), *DELIBERATELY_STRICTER})
    with ThreadPoolExecutor(4) as pool:
        verdicts = pool.map(lambda raw: _kubectl_parses(raw, tmp_path), cases)
        theirs = dict(zip(cases, verdicts, strict=True))
    ours = {raw: _parse_or_refuse(raw) is not None for raw in cases}
    differing = [raw for raw in cases if theirs[raw] != ours[raw]]
    assert differing == sorted(DELIBERATELY_STRICTER)
