"""Registered function names: the one place they are spelled, so an orchestrator never calls a drifting literal."""

# Triggers
SUBMISSION = "submission"  # the shared orders-inbound queue (the legacy app's)
SUBMISSION_PREFIX = "submission-"  # `submission-<app>`: each app's own inbound queue (triggers/submission.py)
STARTER_TIMER = "starter_timer"
AGENT_REPLIES = "agent_replies"
SUPERVISOR = "supervisor"
PURGE = "purge"  # finished Durable instances past InstanceRetentionSeconds (triggers/retention.py)
ALARMS = "alarms"  # the alarm figures and their metrics (triggers/alarms.py)

# The Scheduler
ORDER_WORKFLOW = "order_workflow"

# Activities
SET_STEP_DEADLINE = "set_step_deadline"
LOAD_ORDER = "load_order"
SEND_AGENT_REQUEST = "send_agent_request"
RECORD_STEP_RESULT = "record_step_result"
FINISH_ORDER = "finish_order"
DEFER_ORDER = "defer_order"
BEGIN_COMPENSATION = "begin_compensation"
# Workflow version 3: one activity per decision point (orderflow/advance.py).
ADVANCE_ORDER = "advance_order"

# The operator HTTP API (triggers/ops_api.py; routes under /api, documented by GET /api/openapi.json)
OPS_ORDER = "ops_order"
OPS_ORDERS = "ops_orders"
OPS_RESUBMIT = "ops_resubmit"
OPS_CANCEL = "ops_cancel"
OPS_SUMMARY = "ops_summary"
OPS_OPENAPI = "ops_openapi"


def submission_of(app: str) -> str:
    """The submission trigger of an app's own inbound queue."""
    return f"{SUBMISSION_PREFIX}{app}"
