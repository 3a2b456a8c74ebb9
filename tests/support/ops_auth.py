"""Callers of the operator API as App Service Authentication hands them to the app (orderflow/ops_http.py): the
X-MS-CLIENT-PRINCIPAL headers of an Entra ID principal, and the app settings with Easy Auth on."""

from __future__ import annotations

import base64
import json

ROLE = "Orders.Operator"
EASY_AUTH_ON = {"WEBSITE_AUTH_ENABLED": "True"}
OBJECT_ID_CLAIM = "http://schemas.microsoft.com/identity/claims/objectidentifier"
NAME_TYPE = "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name"
ROLE_TYPE = "http://schemas.microsoft.com/ws/2008/06/identity/claims/role"


def principal_header(name: str, object_id: str, *roles: str, role_claim: str = "roles", auth_typ: str = "aad") -> str:
    """X-MS-CLIENT-PRINCIPAL as Easy Auth writes it for Entra ID (app roles as claims of type `role_claim`)."""
    claims = [
        {"typ": OBJECT_ID_CLAIM, "val": object_id},
        {"typ": NAME_TYPE, "val": name},
        *({"typ": role_claim, "val": role} for role in roles),
    ]
    data = {"auth_typ": auth_typ, "claims": claims, "name_typ": NAME_TYPE, "role_typ": ROLE_TYPE}
    return base64.b64encode(json.dumps(data).encode()).decode()


def signed_in(name: str = "ada@contoso.com", object_id: str = "oid-ada", *roles: str) -> dict[str, str]:
    """Every header Easy Auth sets for a signed-in principal."""
    return {
        "X-MS-CLIENT-PRINCIPAL": principal_header(name, object_id, *roles),
        "X-MS-CLIENT-PRINCIPAL-NAME": name,
        "X-MS-CLIENT-PRINCIPAL-ID": object_id,
        "X-MS-CLIENT-PRINCIPAL-IDP": "aad",
    }


OPERATOR = signed_in("ada@contoso.com", "oid-ada", ROLE)
