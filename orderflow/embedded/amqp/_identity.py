"""Claims-based security (`$cbs`): the tokens a connection put, kept per audience in its `ConnectionIdentity`; the
identity of a link is the SAS key name of the token that covers its entity (`key_name_for`), whose rights the
endpoint checks (orderflow/embedded/rights). Every signature is accepted. Sources: docs/modules-product.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ._errors import ARGUMENT_ERROR, AmqpError

CBS_NODE = "$cbs"
_PUT_TOKEN = "put-token"
_SAS_PREFIX = "SharedAccessSignature "


@dataclass(frozen=True)
class Token:
    """One token a connection put: its type, the audience it was put for, and what it claims."""

    token_type: str
    audience: str
    key_name: str | None  # SAS `skn=`: the shared access policy (its rights are the claims)
    resource: str | None  # SAS `sr=`: the URI the signature covers
    expires_at: datetime | None
    claims: dict[str, Any] = field(default_factory=dict)


@dataclass
class ConnectionIdentity:
    """Who a connection authenticated as, token by token (the latest per audience)."""

    tokens: dict[str, Token] = field(default_factory=dict)

    def put(self, token: Token) -> None:
        self.tokens[token.audience] = token

    def for_address(self, address: str) -> Token | None:
        """The token whose audience covers `address` (the longest matching audience)."""
        matching = [t for a, t in self.tokens.items() if address.lower().startswith(a.lower().rstrip("/"))]
        return max(matching, key=lambda t: len(t.audience), default=None)

    def key_name_for(self, entity: str) -> str | None:
        """The SAS key name a link to `entity` (`queue`, `queue/$DeadLetterQueue`, `queue/$management`) acts as: the
        token whose audience path covers it (the longest), else any token's; None for a connection without a SAS
        token (a JWT, or no CBS at all: the owner)."""
        path = entity.strip("/").lower()
        paths = {
            urlsplit(a).path.strip("/").lower() if "://" in a else a.strip("/").lower(): t
            for a, t in self.tokens.items()
        }
        covering = [(p, t) for p, t in paths.items() if not p or path == p or path.startswith(p + "/")]
        chosen = max(covering, key=lambda pt: len(pt[0]), default=None)
        token = chosen[1] if chosen else next(iter(self.tokens.values()), None)
        return token.key_name if token is not None else None


def parse_token(token_type: str, audience: str, token: str, expiration: datetime | None) -> Token:
    """A put token: a SharedAccessSignature (`sr`, `sig`, `se`, `skn`) is parsed; another (a JWT) is kept whole."""
    if not token.startswith(_SAS_PREFIX):
        return Token(token_type, audience, None, None, expiration, {"token": token})
    fields = {k: v[0] for k, v in parse_qs(token[len(_SAS_PREFIX) :], keep_blank_values=True).items()}
    expiry = fields.get("se")
    expires_at = datetime.fromtimestamp(int(expiry), UTC) if expiry and expiry.isdigit() else expiration
    resource = unquote(fields["sr"]) if "sr" in fields else None
    return Token(token_type, audience, fields.get("skn"), resource, expires_at)


def put_token(
    identity: ConnectionIdentity,
    properties: dict[str, Any],
    body: Any,
    exists: Callable[[str], bool],
    refuse_key: Callable[[str], str | None] = lambda _: None,
) -> tuple[int, str]:
    """Handle one `$cbs` request; returns the status code and description: 202 Accepted, or 404 when the
    audience names an entity that does not exist (`exists(audience)` false), as Service Bus answers; 401 with
    `refuse_key(key name)`'s description when it refuses the token's SAS key name."""
    operation = properties.get("operation")
    if operation != _PUT_TOKEN:
        raise AmqpError(ARGUMENT_ERROR, f"Unsupported $cbs operation {operation!r}.", 400)
    audience = properties.get("name")
    if not isinstance(body, str) or not audience:
        raise AmqpError(ARGUMENT_ERROR, "A put-token request needs a name and a string token.", 400)
    if not exists(str(audience)):
        return 404, f"The messaging entity '{audience}' could not be found."
    expiration = properties.get("expiration")
    token = parse_token(str(properties.get("type") or ""), str(audience), body, _moment(expiration))
    refused = refuse_key(token.key_name) if token.key_name else None
    if refused is not None:
        return 401, refused
    identity.put(token)
    return 202, "Accepted"


def _moment(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, int):
        return datetime.fromtimestamp(value / 1000, UTC)
    return None
