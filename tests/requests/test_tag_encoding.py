"""The fast tag encoder is byte-identical to canonical JSON of ``tag_body``; the iterative
Merkle root equals RFC 6962's recursive definition."""

from __future__ import annotations

import hashlib
import random
from datetime import UTC, datetime, timedelta, timezone

import pytest

from registry.canonical import canonical_json
from registry.requests.encoding import json_string, spec_json, tag_digest_hex, tag_json, time_text
from registry.trust.bundle_verify import _leaf, _root, format_time, merkle_root, tag_body

_STRINGS = [
    "req-1",
    'a"b\\c/d',
    "tab\there\nnewline\r\x00\x1f",
    "ünïcødé-✓-😀",
    "\u2028\u2029",
    "x" * 200,
]


def _specs(rng: random.Random) -> list[object]:
    big = 2**70
    return [
        None,
        {
            "num_spec_steps": 4,
            "num_draft_tokens": 16,
            "num_accepted_draft_tokens": 9,
            "acceptance_histogram": [1, 0, 1, 1, 1],
        },
        {
            "num_spec_steps": 0,
            "num_draft_tokens": 0,
            "num_accepted_draft_tokens": 0,
            "acceptance_histogram": None,
        },
        {
            "num_spec_steps": big,
            "num_draft_tokens": rng.randrange(10**6),
            "num_accepted_draft_tokens": True,  # an int subclass: the fallback path
            "acceptance_histogram": [],
        },
        {"other": "shape", "num_spec_steps": 1},  # unknown keys: the fallback path
        {
            "num_spec_steps": 1,
            "num_draft_tokens": 2,
            "num_accepted_draft_tokens": 3,
            "acceptance_histogram": [1.5, 2],  # a float: the fallback path
        },
    ]


def _times(rng: random.Random) -> list[datetime]:
    base = datetime(2026, 11, 29, 14, 0, 0, 123456, tzinfo=UTC)
    plus2 = timezone(timedelta(hours=2))
    return [
        base,
        base.replace(microsecond=0),
        base.astimezone(plus2),
        datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC),  # strftime does not pad years < 1000
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        base + timedelta(microseconds=rng.randrange(10**12)),
    ]


def test_tag_json_is_canonical_json_of_tag_body() -> None:
    rng = random.Random(7)
    checked = 0
    for rid in _STRINGS:
        for dep in _STRINGS[:3] + ["chat-prod"]:
            for at in _times(rng):
                for spec in _specs(rng):
                    ins, outs = rng.randrange(10**9), rng.choice([0, 1, True, 2**65])
                    body = tag_body(
                        request_id=rid,
                        deployment=dep,
                        pair_digest="ab" * 32,
                        served_at=at,
                        input_tokens=ins,
                        output_tokens=outs,
                        spec=spec,  # type: ignore[arg-type]
                    )
                    fast = tag_json(
                        request_id=rid,
                        deployment_json=json_string(dep),
                        pair_digest_json=json_string("ab" * 32),
                        served_at=time_text(at),
                        input_tokens=ins,
                        output_tokens=outs,
                        spec=spec_json(spec),  # type: ignore[arg-type]
                    )
                    assert fast == canonical_json(body)
                    checked += 1
    assert checked == len(_STRINGS) * 4 * 6 * 6


def test_digest_is_the_one_recorded_today() -> None:
    """A fixed tag's digest, pinned: the stored digests of existing tags stay valid."""
    parts = dict(
        request_id="req-7f3a",
        deployment_json=json_string("chat-prod"),
        pair_digest_json=json_string("0" * 64),
        served_at=time_text(datetime(2026, 11, 29, 14, 0, 0, 123456, tzinfo=UTC)),
        input_tokens=42,
        output_tokens=128,
        spec=spec_json(
            {
                "num_spec_steps": 40,
                "num_draft_tokens": 160,
                "num_accepted_draft_tokens": 88,
                "acceptance_histogram": [5, 8, 10, 9, 8],
            }
        ),
    )
    expected = (
        b'{"deployment":"chat-prod","input_tokens":42,"output_tokens":128,'
        b'"pair_digest":"' + b"0" * 64 + b'","request_id":"req-7f3a",'
        b'"served_at":"2026-11-29T14:00:00.123456Z","spec":{"acceptance_histogram":[5,8,10,9,8],'
        b'"num_accepted_draft_tokens":88,"num_draft_tokens":160,"num_spec_steps":40}}'
    )
    assert tag_json(**parts) == expected  # type: ignore[arg-type]
    assert tag_digest_hex(**parts) == hashlib.sha256(expected).hexdigest()


@pytest.mark.parametrize("n", [*range(1, 40), 64, 65, 1000, 1023, 1025])
def test_iterative_merkle_root_matches_the_recursive_definition(n: int) -> None:
    digests = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)]
    assert merkle_root(digests) == _root([_leaf(d) for d in digests]).hex()


def test_time_text_matches_format_time() -> None:
    rng = random.Random(3)
    for at in _times(rng):
        assert time_text(at) == format_time(at)


def test_counters_json_from_the_validated_model() -> None:
    from registry.records.requests import SpecCounters
    from registry.requests.encoding import counters_json

    for raw in _specs(random.Random(5))[1:3]:
        sc = SpecCounters.model_validate(raw)
        fast = counters_json(
            sc.num_spec_steps,
            sc.num_draft_tokens,
            sc.num_accepted_draft_tokens,
            sc.acceptance_histogram,
        )
        assert fast == canonical_json(sc.model_dump()).decode()
    assert counters_json(1, 2, 3, (1, 2)) is None  # not a list: left to the slow path


def test_cached_time_texts_match_format_time() -> None:
    from registry.requests.encoding import time_texts

    rng = random.Random(9)
    text = time_texts()
    base = datetime(2026, 11, 29, 14, 0, 0, tzinfo=UTC)
    plus5 = timezone(timedelta(hours=5, minutes=30))
    times = _times(rng) + [
        datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),  # before the epoch
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1000, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
    ]
    for _ in range(3000):  # many per second, as in a batch: the cache is hit
        at = base + timedelta(microseconds=rng.randrange(5 * 10**6))
        times.append(at.astimezone(plus5) if rng.random() < 0.3 else at)
    for at in times + times:
        assert text(at) == format_time(at)


def test_validated_counters_are_plain_ints_and_encode_canonically() -> None:
    """pydantic returns exact ints for int fields, whatever int-like came in: the unchecked
    encoder relies on it."""
    import enum

    from registry.records.requests import SpecCounters, TagIn
    from registry.requests.encoding import validated_counters_json

    class Level(enum.IntEnum):
        three = 3

    class Sub(int):
        pass

    rng = random.Random(4)
    for odd in (True, Level.three, Sub(4), 5.0, "6", 2**70):
        raw = {
            "num_spec_steps": odd,
            "num_draft_tokens": rng.randrange(10**6),
            "num_accepted_draft_tokens": odd,
            "acceptance_histogram": rng.choice([None, [], [odd, 1, odd]]),
        }
        sc = TagIn.model_validate(
            {"request_id": "r", "deployment": "d", "served_at": "2026-01-01T00:00:00Z",
             "input_tokens": odd, "spec": raw}
        ).spec  # fmt: skip
        assert isinstance(sc, SpecCounters)
        values = [sc.num_spec_steps, sc.num_draft_tokens, sc.num_accepted_draft_tokens]
        values += sc.acceptance_histogram or []
        assert all(type(v) is int for v in values)
        fast = validated_counters_json(
            sc.num_spec_steps,
            sc.num_draft_tokens,
            sc.num_accepted_draft_tokens,
            sc.acceptance_histogram,
        )
        assert fast == canonical_json(sc.model_dump()).decode()
