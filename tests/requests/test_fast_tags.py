"""The ingest hot path's msgspec decoder (``registry.records.requests.decode_tags``) against
pydantic's :class:`TagIn`: whatever the fast path accepts, pydantic accepts with exactly the
same values (so a tag's digest does not depend on which path read it); whatever pydantic
refuses, the fast path refuses too (and pydantic then reports it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from registry.records.requests import DecodedTags, FastTag, TagIn, decode_tags

SPEC_FIELDS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens",
               "acceptance_histogram")  # fmt: skip
OK = '{"request_id":"r","deployment":"d","served_at":"2026-11-29T14:00:00Z"}'


def _values(tag: Any) -> dict[str, Any]:
    out = {f: getattr(tag, f) for f in TagIn.model_fields}
    if out["spec"] is not None:
        out["spec"] = {f: getattr(out["spec"], f) for f in SPEC_FIELDS}
    out["utcoffset"] = out["served_at"].utcoffset()
    out["types"] = [type(v) for k, v in out.items() if k not in ("served_at", "spec")]
    return out


def _both(tag_json: str) -> tuple[FastTag | None, TagIn | None]:
    fields = decode_tags(('{"tags":[' + tag_json + "]}").encode())
    try:
        slow = TagIn.model_validate_json(tag_json)
    except ValidationError:
        slow = None
    return (None if fields is None else fields["tags"][0]), slow


def _tag(**kw: str) -> str:
    return OK[:-1] + "".join(f",{json.dumps(k)}:{v}" for k, v in kw.items()) + "}"


EDGE_CASES = [
    OK,
    OK.replace("00Z", "00.5Z"),
    OK.replace("00Z", "00.123456Z"),
    OK.replace("00Z", "00.1234567Z"),  # pydantic truncates, msgspec's parser would round
    OK.replace("00Z", "00.1234565Z"),
    OK.replace("00Z", "00+05:30"),
    OK.replace("00Z", "00-00:00"),
    OK.replace("00Z", "00+23:59"),
    OK.replace("00Z", "00+24:00"),
    OK.replace("00Z", "00+0000"),
    OK.replace("00Z", "00"),  # naive
    OK.replace("T", "t"),
    OK.replace("T", " "),
    OK.replace("14:00:00Z", "14:00Z"),
    OK.replace("14:00:00Z", "14:00:00,5Z"),
    OK.replace("14:00:00", "23:59:60"),
    OK.replace("14:00:00", "24:00:00"),
    OK.replace("11-29", "02-30"),
    OK.replace("2026", "0000"),
    OK.replace("2026", "٢٠٢٦"),  # Arabic-Indic digits
    OK.replace('"2026-11-29T14:00:00Z"', "1700000000"),
    OK.replace('"2026-11-29T14:00:00Z"', '"1700000000"'),
    OK.replace('"r"', '""'),
    OK.replace('"r"', '"' + "x" * 200 + '"'),
    OK.replace('"r"', '"' + "x" * 201 + '"'),
    OK.replace('"r"', '"' + "é" * 200 + '"'),
    OK.replace('"r"', '"a\\u0000b"'),
    OK.replace('"r"', '"\\ud800"'),
    OK.replace('"r"', "1"),
    OK.replace('"r"', "null"),
    OK.replace('"d"', '"' + "d" * 101 + '"'),
    _tag(pair_digest='"' + "a" * 64 + '"'),
    _tag(pair_digest='"' + "a" * 64 + '\\n"'),
    _tag(pair_digest='"' + "A" * 64 + '"'),
    _tag(pair_digest='"' + "a" * 63 + '"'),
    _tag(pair_digest="null"),
    *[
        _tag(input_tokens=v)
        for v in (
            "0",
            "-0",
            "-1",
            "1.0",
            "1.5",
            '"3"',
            "true",
            "null",
            "1e3",
            "9223372036854775807",
            "99999999999999999999",
        )
    ],  # fmt: skip
    _tag(spec="null"),
    _tag(spec="{}"),
    _tag(spec='{"num_spec_steps":1,"num_draft_tokens":2,"num_accepted_draft_tokens":1}'),
    _tag(
        spec='{"num_spec_steps":1,"num_draft_tokens":2,"num_accepted_draft_tokens":1,'
        '"acceptance_histogram":[1,-2]}'
    ),  # fmt: skip
    _tag(
        spec='{"num_spec_steps":1,"num_draft_tokens":2,"num_accepted_draft_tokens":1,'
        '"acceptance_histogram":[true]}'
    ),  # fmt: skip
    _tag(spec='{"num_spec_steps":1,"num_draft_tokens":2,"num_accepted_draft_tokens":-1}'),
    _tag(spec='{"num_spec_steps":1,"num_draft_tokens":2,"num_accepted_draft_tokens":1,"x":1}'),
    _tag(extra="1"),
    '{"request_id":"r","request_id":"s","deployment":"d","served_at":"2026-11-29T14:00:00Z"}',
    '{"deployment":"d","served_at":"2026-11-29T14:00:00Z"}',
]


@pytest.mark.parametrize("tag_json", EDGE_CASES)
def test_fast_path_never_accepts_what_pydantic_refuses_or_reads_it_differently(
    tag_json: str,
) -> None:
    fast, slow = _both(tag_json)
    if fast is not None:
        assert slow is not None, f"fast path accepted what pydantic refuses: {tag_json}"
        assert _values(fast) == _values(slow)
    if slow is None:
        assert fast is None


def test_the_common_forms_take_the_fast_path() -> None:
    """Not vacuous: the forms clients send (isoformat() with an offset, Z, counters) decode."""
    accepted = [c for c in EDGE_CASES if _both(c)[0] is not None]
    assert len(accepted) >= 15
    for case in (OK, OK.replace("00Z", "00.123456+00:00"), _tag(spec="null")):
        assert _both(case)[0] is not None, case
    body = decode_tags(b'{"tags": []}')
    assert body == {"tags": []} and type(body["tags"]) is DecodedTags
    assert decode_tags(b'{"tags": [], "x": 1}') is None
    assert decode_tags(b"not json") is None


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_int = st.one_of(st.integers(-3, 2**65), st.floats(allow_nan=False), st.booleans(), st.none(),
                 st.text("0123456789", min_size=1, max_size=3))  # fmt: skip
_time = st.one_of(
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.builds(
        lambda d, frac, sep, off: d.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + frac + off,
        st.datetimes(),
        st.sampled_from(["", ".1", ".123456", ".1234567", ","]),
        st.sampled_from(["T", "t", " "]),
        st.sampled_from(["Z", "z", "+00:00", "-23:59", "+24:00", "+0530", ""]),
    ),
    _text,
    st.integers(0, 2**40),
)
_tags = st.fixed_dictionaries(
    {"request_id": st.one_of(_text, st.integers()), "deployment": _text, "served_at": _time},
    optional={
        "pair_digest": st.one_of(
            st.none(), st.text("0123456789abcdefA\n", min_size=63, max_size=65)
        ),  # fmt: skip
        "input_tokens": _int,
        "output_tokens": _int,
        "spec": st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {
                    "num_spec_steps": _int,
                    "num_draft_tokens": _int,
                    "num_accepted_draft_tokens": _int,
                },  # fmt: skip
                optional={"acceptance_histogram": st.one_of(st.none(), st.lists(_int, max_size=3))},
            ),
        ),
    },
)


@settings(max_examples=400, deadline=None)
@given(_tags)
def test_random_tags_agree(tag: dict[str, Any]) -> None:
    test_fast_path_never_accepts_what_pydantic_refuses_or_reads_it_differently(json.dumps(tag))
