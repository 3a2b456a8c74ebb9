"""Sender-chosen text: bounded and escaped (orderflow/text.py), and what the message parser makes of hostile bodies.

A dead-letter reason or description past 4,096 characters (UTF-16 code units) is refused by the Service Bus SDK the
Functions host settles with (Azure.Messaging.ServiceBus AmqpReceiver.DeadLetterInternalAsync: ArgumentOutOfRange-
Exception "The argument 'deadLetterReason' cannot exceed 4096 characters."; Azure/azure-sdk-for-net PR #32396).
json.loads raises RecursionError past the interpreter's recursion limit and ValueError for an integer past Python's
digit limit (docs.python.org, "Integer string conversion length limitation").
"""

from __future__ import annotations

import json

import pytest

from orderflow.messages import (
    AgentRequest,
    InvalidMessage,
    inbound_type,
    parse_cancel_order,
    parse_message,
    parse_submit_order,
)
from orderflow.text import DEAD_LETTER_TEXT_MAX, QUOTE_MAX, bounded, printable, quote, shown, utf16_length

ORDER = {
    "type": "SubmitOrder",
    "schemaVersion": 1,
    "orderId": "o-1",
    "replyTo": "app-status",
    "customer": {"id": "c-1", "name": "Ada"},
    "items": [{"sku": "S", "quantity": 1, "unitPrice": "1.00"}],
    "currency": "EUR",
    "submittedAt": "2024-01-01T00:00:00+00:00",
}
BIG = 204_800


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def refusal(body: str | bytes) -> InvalidMessage:
    with pytest.raises(InvalidMessage) as raised:
        parse_submit_order(body)
    return raised.value


# ---- the helpers ---------------------------------------------------------------------------------------------------


def test_bounded_keeps_short_text_and_cuts_long_text_saying_its_length() -> None:
    assert bounded("short") == "short"
    cut = bounded("x" * 10_000)
    assert len(cut) == DEAD_LETTER_TEXT_MAX and cut.endswith("x… (10000 characters)")
    assert len(bounded("y" * 500, 100)) == 100


def test_bounded_counts_characters_as_dotnet_does_utf16_code_units() -> None:
    # .NET's String.Length, which the host's SDK checks (AmqpReceiver.DeadLetterInternalAsync, Argument.
    # AssertNotTooLong): a character past U+FFFF is two code units, so 2,049 of them are over 4,096.
    emoji = "\U0001f600"
    assert utf16_length("a" + emoji) == 3 and bounded(emoji * 2048) == emoji * 2048
    cut = bounded(emoji * 5000)
    assert utf16_length(cut) == DEAD_LETTER_TEXT_MAX and cut.endswith(f"{emoji}… (10000 characters)")
    odd = bounded("a" + emoji * 5000)  # the last character that fits would be split: it is left out
    assert utf16_length(odd) == DEAD_LETTER_TEXT_MAX - 1 and "\ud83d" not in odd


def test_quote_cuts_a_long_value_and_says_its_length() -> None:
    assert quote("abc") == "'abc'" and quote(None) == "None"
    assert quote("a" * BIG) == f"'{'a' * QUOTE_MAX}…' ({BIG} characters)"
    assert len(quote(list(range(100_000)))) <= 4 * QUOTE_MAX
    assert len(quote(json.loads(nested(500)))) <= 4 * QUOTE_MAX  # reprlib bounds nesting too


def test_printable_escapes_what_could_forge_a_line_or_drive_a_terminal() -> None:
    assert printable("m-1\nINFO forged\r\x1b[31m\x00\u202e\u2028") == "m-1\\nINFO forged\\r\\x1b[31m\\x00\\u202e\\u2028"
    assert printable("Zoë ✓ [/]") == "Zoë ✓ [/]"  # letters, symbols and brackets stay
    assert shown(None) == "-" and len(shown("z" * BIG)) == DEAD_LETTER_TEXT_MAX


# ---- hostile bodies are refused with a reason, never an escaping exception ---------------------------------------


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_deeply_nested_json_is_invalid_json_with_a_reason(depth: int) -> None:
    error = refusal(nested(depth))
    assert (error.reason, error.description) == ("InvalidJson", "body is nested too deeply to parse")
    with pytest.raises(InvalidMessage, match="InvalidJson"):
        inbound_type(nested(depth))
    with pytest.raises(InvalidMessage, match="InvalidJson"):
        parse_cancel_order(json.dumps(ORDER)[:-1] + f', "reason": {nested(depth)}}}')


def test_an_integer_past_the_digit_limit_is_invalid_json() -> None:
    error = refusal(json.dumps(ORDER)[:-1] + ', "x": ' + "1" * 5_000 + "}")
    assert error.reason == "InvalidJson" and "integer string conversion" in error.description


def test_a_huge_unknown_field_name_is_quoted_cut_with_its_length() -> None:
    error = refusal(json.dumps({**ORDER, "a" * BIG: 1}))
    assert error.description == f"unknown field 'a{'a' * (QUOTE_MAX - 1)}…' ({BIG} characters)"
    assert error.reason.startswith("InvalidField:aaa") and error.reason.endswith(f"… ({BIG} characters)")
    assert len(error.reason) <= len("InvalidField:") + QUOTE_MAX


def test_a_huge_nested_field_name_and_a_huge_wrong_value_are_bounded() -> None:
    items = [{"sku": "S", "quantity": 1, "unitPrice": "1.00", "k" * BIG: 1}]
    error = refusal(json.dumps({**ORDER, "items": items}))
    assert error.reason.startswith("InvalidField:items.0.kkk") and f"({BIG + 8} characters)" in error.description
    wrong = refusal(json.dumps({**ORDER, "type": "x" * BIG}))
    assert wrong.reason == "UnknownType" and f"({BIG} characters)" in wrong.description
    assert len(wrong.description) < 4 * QUOTE_MAX
    version = refusal(json.dumps({**ORDER, "schemaVersion": ["v"] * BIG}))
    assert version.reason == "UnsupportedSchemaVersion" and len(version.description) < 8 * QUOTE_MAX


def test_control_characters_in_a_field_name_are_escaped_in_the_reason() -> None:
    error = refusal(json.dumps({**ORDER, "x\n\x1b[31m": 1}))
    assert error.reason == "InvalidField:x\\n\\x1b[31m" and "\n" not in error.description


def test_every_invalid_message_stays_within_the_dead_letter_limit() -> None:
    error = InvalidMessage("R" * BIG, "D" * BIG)
    assert len(error.reason) == len(error.description) == DEAD_LETTER_TEXT_MAX


def test_an_agent_request_nested_too_deeply_to_validate_is_refused_with_a_reason() -> None:
    """A payload nested to just under json.loads' limit parses; validating it must not escape as RecursionError."""
    request = {
        "type": "AgentRequest",
        "schemaVersion": 1,
        "instanceId": "o-1:1",
        "orderId": "o-1",
        "attempt": 1,
        "step": "charge-payment",
        "idempotencyKey": "o-1:charge-payment",
        "deadline": "2024-01-01T00:00:00+00:00",
        "replyTo": "agent-replies",
    }
    for depth in (50, 900, 5_000):
        body = json.dumps(request)[:-1] + f', "payload": {{"a": {nested(depth)}}}}}'
        try:
            parse_message(AgentRequest, "AgentRequest", body)
        except InvalidMessage as exc:
            assert exc.reason in ("InvalidJson", "InvalidField:body")
