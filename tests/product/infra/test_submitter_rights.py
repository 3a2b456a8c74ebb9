"""Each submitting app's rights, derived from the role assignments of infra/ as main.bicep deploys them (the rights
module's evaluator: orderflow/embedded/rights), for deployments of two and three apps (issue 25): an app may send to
its own inbound queue `<app>-orders` only, never to another app's, and to orders-inbound only if it is the legacy app;
it reads its own status queue only. The function app reads every app's inbound queue, and orders-inbound only while
there is a legacy app. The app settings the deployment gives (SubmittingApps, LegacyOrdersApp) are ones the code
accepts (orderflow/apps.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from support.bicep_tree import DEPLOYED, INFRA, Opaque, Scope, evaluate, main, module_scope, with_values

from orderflow import apps
from orderflow.embedded.rights import FUNCTION_APP, LISTEN, OPERATORS, SEND, Rights
from orderflow.embedded.rights._grants import deployment_grants

ORDERS_INBOUND = "orders-inbound"
TWO = ["shop", "partner"]
THREE = ["shop", "partner", "b2b-gateway"]
# (apps, legacyOrdersApp as passed: None leaves the default, the first app; the legacy app it means or None).
CASES = {
    "two-apps-default-legacy": (TWO, None, "shop"),
    "three-apps-legacy-second": (THREE, "partner", "partner"),
    "three-apps-no-legacy": (THREE, "none", None),
    "two-apps-empty-legacy": (TWO, "", None),
}


def _deployment(names: list[str], legacy: str | None) -> Scope:
    """main.bicep deployed with these apps (each principal id a placeholder: the app's name) and an operators group."""
    values: dict[str, Any] = {
        "submittingApps": [{"name": n, "principalId": n, "principalType": "ServicePrincipal"} for n in names],
        "operatorPrincipalId": OPERATORS,
    }
    if legacy is not None:
        values["legacyOrdersApp"] = legacy
    return with_values(Scope(main(), functions=DEPLOYED), values)


def _rights(names: list[str], legacy: str | None) -> Rights:
    return Rights(tuple(deployment_grants(_deployment(names, legacy))), INFRA)


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> tuple[list[str], str | None, Rights]:
    names, passed, legacy = CASES[request.param]
    return names, legacy, _rights(names, passed)


def test_each_app_sends_to_its_own_inbound_queue_only(case: tuple[list[str], str | None, Rights]) -> None:
    names, legacy, rights = case
    for app in names:
        assert rights.bus_allows(app, SEND, apps.inbound_queue(app)), app
        for other in set(names) - {app}:
            assert not rights.bus_allows(app, SEND, apps.inbound_queue(other)), (app, other)
            assert not rights.bus_allows(app, LISTEN, apps.status_queue(other)), (app, other)
            assert not rights.bus_allows(app, LISTEN, apps.inbound_queue(other)), (app, other)
        assert rights.bus_allows(app, SEND, ORDERS_INBOUND) is (app == legacy), app
        assert rights.bus_allows(app, LISTEN, apps.status_queue(app)), app


def test_an_apps_grants_are_exactly_its_queues(case: tuple[list[str], str | None, Rights]) -> None:
    names, legacy, rights = case
    for app in names:
        expected = {
            ("Service Bus Data Sender", apps.inbound_queue(app)),
            ("Service Bus Data Receiver", f"{app}-status"),
        }
        if app == legacy:
            expected.add(("Service Bus Data Sender", ORDERS_INBOUND))
        assert {(g.role.name, g.service, g.resource) for g in rights.of(app)} == {
            (role, "servicebus", queue) for role, queue in expected
        }, app


def test_only_the_legacy_app_and_the_operators_may_send_to_orders_inbound(
    case: tuple[list[str], str | None, Rights],
) -> None:
    _, legacy, rights = case
    senders = {i for i in rights.identities if rights.bus_allows(i, SEND, ORDERS_INBOUND)}
    assert senders == {OPERATORS} | ({legacy} if legacy else set())


def test_the_function_app_reads_every_apps_inbound_queue(case: tuple[list[str], str | None, Rights]) -> None:
    names, legacy, rights = case
    for app in names:
        assert rights.bus_allows(FUNCTION_APP, LISTEN, apps.inbound_queue(app)), app
        assert not rights.bus_allows(FUNCTION_APP, SEND, apps.inbound_queue(app)), app
    # orders-inbound has a submission trigger only while there is a legacy app (triggers/submission.py).
    assert rights.bus_allows(FUNCTION_APP, LISTEN, ORDERS_INBOUND) is (legacy is not None)


def test_the_app_settings_name_the_apps_and_the_legacy_app_as_the_code_reads_them(
    case: tuple[list[str], str | None, Rights],
) -> None:
    names, legacy, _ = case
    passed = next(p for n, p, lg in CASES.values() if n == names and lg == legacy)
    scope = module_scope(_deployment(names, passed), main().module("functionApp"))
    code = evaluate(scope.file.variables["codeSettings"], scope)
    assert code["SubmittingApps"] == ",".join(names)
    assert code["LegacyOrdersApp"] == (legacy or apps.NO_LEGACY_APP)
    assert code["MaxPendingOrdersPerApp"] == ""
    parsed = apps.SubmittingApps.parse(code["SubmittingApps"], code["LegacyOrdersApp"], 5000, "")
    assert parsed.names == tuple(names) and parsed.legacy == legacy
    # Every queue the code reads or answers on is one main.bicep has the Service Bus module create.
    deployment = _deployment(names, passed)
    params = main().module("serviceBus").params()
    created = {*evaluate(params["inboundQueueNames"], deployment), *evaluate(params["statusQueueNames"], deployment)}
    assert parsed.inbound_queues() | parsed.status_queues() == created


def test_a_legacy_app_that_is_not_a_submitting_app_fails_the_deployment() -> None:
    """main.bicep's legacyApp is fail(...) for a name outside submittingApps: ARM stops the deployment with that
    message (Bicep's fail(), in a variable of parameters only, is evaluated before any resource is deployed)."""
    scope = _deployment(TWO, "ghost")
    value = evaluate(main().variables["legacyApp"], scope)
    assert isinstance(value, Opaque) and value.text.startswith("fail('legacyOrdersApp")
    assert evaluate(main().variables["legacyApp"], _deployment(TWO, "partner")) == "partner"
    with pytest.raises(ValueError, match="does not reduce to true or false"):
        deployment_grants(scope)  # the rights refuse to guess who would hold the legacy grants


def test_once_the_legacy_app_has_moved_nobody_sends_to_orders_inbound_but_it_is_still_read() -> None:
    # The last step of "Move an app to its own queue" (docs/deploy.md): legacyOrdersQueueOpen false.
    deployment = with_values(_deployment(THREE, "partner"), {"legacyOrdersQueueOpen": False})
    rights = Rights(tuple(deployment_grants(deployment)), INFRA)
    assert {i for i in rights.identities if rights.bus_allows(i, SEND, ORDERS_INBOUND)} == {OPERATORS}
    assert rights.bus_allows("partner", SEND, apps.inbound_queue("partner"))
    assert rights.bus_allows(FUNCTION_APP, LISTEN, ORDERS_INBOUND)  # what is left there is still processed
    code = evaluate(
        main().module("functionApp").target().variables["codeSettings"],
        module_scope(deployment, main().module("functionApp")),
    )
    assert code["LegacyOrdersApp"] == "partner"  # its order ids stay unscoped
    assert evaluate(main().params["legacyOrdersQueueOpen"], Scope(main())) is True
