"""App Service Authentication ("Easy Auth") stand-in for devhost's HTTP triggers (`/api/...`): what Azure's front end
does before the host, with the deploy's settings (authentication required, `Return401`), when WEBSITE_AUTH_ENABLED is
True. It drops client-sent X-MS-CLIENT-PRINCIPAL* and X-MS-TOKEN-* headers, answers 401 (no body) to a request
without a valid token before any route, method or key check, and hands a signed-in one to the host with
X-MS-CLIENT-PRINCIPAL (Base64 JSON {auth_typ, claims, name_typ, role_typ}, Entra ID's shape: app roles as claims of
type "roles") and X-MS-CLIENT-PRINCIPAL-NAME, -ID, -IDP (learn.microsoft.com/azure/app-service/
configure-authentication-user-identities, "Access user claims in app code"). It checks no Entra ID token: the one it
accepts is `Authorization: Bearer local:<name>:<role>[,<role>...]`, the object id a UUID derived from the name. Off,
it changes nothing, as Azure without authentication. docs/devhost.md, "Easy Auth stand-in", and its differences.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

SETTING = "WEBSITE_AUTH_ENABLED"
LOCAL_TOKEN = "local:"
IDENTITY_PROVIDER = "aad"
# Easy Auth's claim mapping for Entra ID: the object id and the name types it writes, and its role_typ (Entra's app
# roles still arrive as claims of type "roles").
OBJECT_ID_CLAIM = "http://schemas.microsoft.com/identity/claims/objectidentifier"
NAME_TYPE = "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name"
ROLE_TYPE = "http://schemas.microsoft.com/ws/2008/06/identity/claims/role"
ROLES_CLAIM = "roles"
# Client-sent copies of what the front end sets are never passed on.
_STRIPPED = ("x-ms-client-principal", "x-ms-token-")
_LOCAL_TENANT = uuid.UUID("6f1b5c1e-0d0a-4c5e-9a55-64657668c057")  # names the object ids devhost derives
NAME_MAX_LEN = 256


@dataclass(frozen=True)
class LocalPrincipal:
    """The principal a local token names."""

    name: str
    roles: tuple[str, ...]

    @property
    def object_id(self) -> str:
        return str(uuid.uuid5(_LOCAL_TENANT, self.name))

    def claims_header(self) -> str:
        """X-MS-CLIENT-PRINCIPAL: Base64 of the JSON Easy Auth writes for an Entra ID principal."""
        claims = [
            {"typ": OBJECT_ID_CLAIM, "val": self.object_id},
            {"typ": NAME_TYPE, "val": self.name},
            {"typ": "name", "val": self.name},
            {"typ": "preferred_username", "val": self.name},
            *({"typ": ROLES_CLAIM, "val": role} for role in self.roles),
        ]
        data = {"auth_typ": IDENTITY_PROVIDER, "claims": claims, "name_typ": NAME_TYPE, "role_typ": ROLE_TYPE}
        return base64.b64encode(json.dumps(data).encode()).decode()


def local_token(name: str, *roles: str) -> str:
    """The Authorization header value devhost accepts for `name` holding `roles`."""
    return f"Bearer {LOCAL_TOKEN}{name}:{','.join(roles)}"


def parse_local_token(authorization: str | None) -> LocalPrincipal | None:
    """The principal of `Bearer local:<name>:<roles>`; None for anything else (no header, another scheme or token,
    an empty name, a control character)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith(LOCAL_TOKEN):
        return None
    name, sep, roles = token[len(LOCAL_TOKEN) :].rpartition(":")
    if not sep:
        name, roles = roles, ""
    name = name.strip()
    if not name or len(name) > NAME_MAX_LEN or not name.isprintable():
        return None
    return LocalPrincipal(name, tuple(r.strip() for r in roles.split(",") if r.strip()))


@dataclass(frozen=True)
class EasyAuth:
    """The front end, on (`from_env`) or off (None)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> EasyAuth | None:
        return cls() if env.get(SETTING, "").strip().lower() == "true" else None

    def admit(self, headers: Mapping[str, str]) -> dict[str, str] | None:
        """The headers the host gets: the client's, without principal headers, plus the signed-in principal's; None
        when the request is not authenticated (answer 401)."""
        passed = {k: v for k, v in headers.items() if not k.lower().startswith(_STRIPPED)}
        found = parse_local_token(next((v for k, v in headers.items() if k.lower() == "authorization"), None))
        if found is None:
            return None
        return {
            **passed,
            "X-MS-CLIENT-PRINCIPAL": found.claims_header(),
            "X-MS-CLIENT-PRINCIPAL-NAME": found.name,
            "X-MS-CLIENT-PRINCIPAL-ID": found.object_id,
            "X-MS-CLIENT-PRINCIPAL-IDP": IDENTITY_PROVIDER,
        }
