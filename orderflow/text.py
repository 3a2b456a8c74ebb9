"""Sender-chosen text, bounded and escaped: the one way a name, value, id or reason that came off the wire is quoted
in a dead-letter reason, an alert, a status, a log line or a terminal.

- `quote(value)`: a value as a reason quotes it, at most `QUOTE_MAX` characters of it, with its length said when cut
  (`'aaaa…' (204800 characters)`).
- `bounded(text, limit)`: free text cut to `limit` characters as .NET counts them (UTF-16 code units; default:
  Service Bus's dead-letter limit), its length said when cut.
- `printable(text)`: control, format and line-separator characters written as escapes, so text can neither start a
  new log line nor drive a terminal.
"""

from __future__ import annotations

import reprlib
import unicodedata

# Azure.Messaging.ServiceBus refuses a dead-letter reason or error description longer than 4,096 characters, .NET's
# String.Length: UTF-16 code units (AmqpReceiver.DeadLetterInternalAsync, Argument.AssertNotTooLong: an
# ArgumentOutOfRangeException; Constants.MaxDeadLetterReasonLength; Azure/azure-sdk-for-net PR #32396). The Functions
# host settles through that SDK, so a longer reason from a Python trigger fails the settlement.
DEAD_LETTER_TEXT_MAX = 4096
QUOTE_MAX = 64  # characters of a sender's name or value quoted in a reason
# Categories written as escapes: controls (Cc), format characters such as bidi overrides (Cf), surrogates (Cs),
# private use (Co), unassigned (Cn), and the line and paragraph separators (Zl, Zp).
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, QUOTE_MAX, QUOTE_MAX, QUOTE_MAX


def utf16_length(text: str) -> int:
    """`text`'s length as .NET's String.Length counts it: UTF-16 code units, two for a character past U+FFFF."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def bounded(text: str, limit: int = DEAD_LETTER_TEXT_MAX) -> str:
    """`text` when it has at most `limit` characters (`utf16_length`), else its start, '…' and its length, `limit`
    characters in all; a character is never split."""
    length = utf16_length(text)
    if length <= limit:
        return text
    suffix = f"… ({length} characters)"
    room, end = max(0, limit - len(suffix)), 0
    for char in text[:room]:  # at most `room` characters fit in `room` code units
        room -= 2 if ord(char) > 0xFFFF else 1
        if room < 0:
            break
        end += 1
    return text[:end] + suffix


def quote(value: object, limit: int = QUOTE_MAX) -> str:
    """`repr(value)` for a short string; a longer one cut to `limit` characters with its length said; any other value
    as a bounded repr (reprlib: nesting, containers and numbers cut). Never raises."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit] + '…'!r} ({len(value)} characters)"
    try:
        return bounded(_REPR.repr(value), 4 * limit)
    except Exception:  # noqa: BLE001 - a value whose repr fails (an int past the digit limit) is named by its type
        return f"<{type(value).__name__}>"


def _escape(char: str) -> str:
    code = ord(char)
    return repr(char)[1:-1] if code < 0x80 else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str) -> str:
    """`text` with every character of a hidden category (`_HIDDEN`) written as its Python escape (`\\n`, `\\x1b`,
    `\\u202e`); every other character, non-ASCII letters included, kept."""
    return "".join(_escape(c) if unicodedata.category(c) in _HIDDEN else c for c in text)


def shown(value: object, limit: int = DEAD_LETTER_TEXT_MAX) -> str:
    """A sender-chosen value as a log line or a terminal shows it: `str`, bounded, printable; None as '-'."""
    return "-" if value is None else printable(bounded(str(value), limit))


def first_line(value: object) -> str:
    """The first line of `str(value)` ('' for an empty one)."""
    text = str(value)
    return text.splitlines()[0] if text else ""


def one_line(exc: BaseException, plain: tuple[type[BaseException], ...] = ()) -> str:
    """An exception as one line: its message, with its type unless it is a ValueError or one of `plain` (a KeyError:
    its key's message)."""
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    else:
        text = str(exc).strip() or type(exc).__name__
        if not isinstance(exc, (ValueError, *plain)):
            text = f"{type(exc).__name__}: {text}"
    return " ".join(text.split())  # one line, whatever the message holds
