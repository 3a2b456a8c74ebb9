"""The published figures behind benchmarks/azure_cost.py: sources, prices, limits and the RU rules of thumb."""

from __future__ import annotations

import math
from dataclasses import dataclass

READ_ON = "2026-11-30"  # when every source below was read (the stored copies of the search corpus)
MONTH_S = 2_628_000  # 730 hours: the month of the Durable Task Scheduler billing doc's examples ("seconds in a month")
RATES = (1, 10, 100)  # orders/s of the monthly table


@dataclass(frozen=True)
class Source:
    url: str
    says: str  # what the page says, quoted or closely paraphrased
    note: str = ""


COSMOS_RU_DOC = "https://learn.microsoft.com/azure/cosmos-db/optimize-cost-reads-writes"
SOURCES: dict[str, Source] = {
    "cosmos_point_read": Source(
        COSMOS_RU_DOC,
        "Cost of one point read: 1 KB item 1 RU; 100 KB item 10 RUs.",
        "source: MicrosoftDocs/azure-databases-docs articles/cosmos-db/"
        "optimize-cost-reads-writes.md, ms.date 08/26/2021",
    ),
    "cosmos_write": Source(
        COSMOS_RU_DOC,
        "Inserting a 1 KB item without indexing costs around ~5.5 RUs. Replacing an "
        "item costs two times the charge required to insert the same item.",
        "our containers index every path (STATE_INDEXING_POLICY): real writes cost more",
    ),
    "cosmos_query": Source(
        COSMOS_RU_DOC,
        "Sample query metrics: Retrieved Document Count 1 (9,963 bytes) ... Request "
        "Charge 3.19 RUs; a query returning 1000 1-KB items costs 1000.",
        "no published minimum per query: 3 RU per query and 1 RU per item returned is our rule of "
        "thumb from this sample",
    ),
    "cosmos_cross_partition": Source(
        "https://learn.microsoft.com/azure/cosmos-db/how-to-query-container",
        "a cross-partition query fans out to all physical partitions: effectively one query per physical partition",
        "figures assume one physical partition (containers this small have one)",
    ),
    "cosmos_prices": Source(
        "https://learn.microsoft.com/azure/cosmos-db/understand-your-bill",
        "$0.008 (per 100 RU/sec per hour) [provisioned, single write region]; serverless: 500,000 "
        "Request Units ... $0.125 (500,000 * $0.25/million)",
        "examples 'based on the price for an Azure Cosmos DB account deployed in a non-government "
        "region in the US'; source ms.date 03/31/2022",
    ),
    "cosmos_autoscale": Source(
        "https://learn.microsoft.com/azure/cosmos-db/how-to-choose-offer",
        "public pricing rates for manual ($0.008 USD per 100 RU/s per hour) and autoscale "
        "throughput ($0.012 USD per 100 RU/s per hour) in single-region write accounts; "
        "autoscale scales 0.1*Tmax <= T <= Tmax; manual entry point 400 RU/s",
        "source ms.date 07/26/2024",
    ),
    "cosmos_serverless_limit": Source(
        "https://learn.microsoft.com/azure/cosmos-db/serverless",
        "A serverless container begins with a throughput of 5,000 RU/s. Each physical "
        "partition within a serverless container can handle up to 5,000 RU/s; best for "
        "low (less than 10 percent) average-to-peak traffic ratio",
        "source ms.date 03/16/2023",
    ),
    "cosmos_autoscale_entry": Source(
        "https://learn.microsoft.com/azure/cosmos-db/provision-throughput-autoscale",
        "The entry point for autoscale maximum throughput Tmax starts at 1000 RU/s ... "
        "You can set Tmax in increments of 1000 RU/s",
    ),
    "servicebus_throttling": Source(
        "https://learn.microsoft.com/azure/service-bus-messaging/service-bus-throttling",
        "The credit limits are currently set to 1000 credits every second (per namespace). "
        "Data operations (Send, SendAsync, Receive, ReceiveAsync, Peek): 1 credit per "
        "message; management operations: 10 credits",
        "complete, abandon, session accept, lock renewal are not in the table",
    ),
    "servicebus_pricing": Source(
        "https://azure.microsoft.com/pricing/details/service-bus/",
        "An operation is any API call to the Service Bus service. Standard: base charge; "
        "first 13M ops/month included; next 87M (13M-100M); next 2,400M (100M-2,500M); "
        "over 2,500M",
        "USD figures NOT FOUND in the stored docs: the stored page shows '$-' for each",
    ),
    "servicebus_pricing_cn": Source(
        "https://www.azure.cn/en-us/pricing/details/service-bus/",
        "Standard: base charge ¥0.0851/hour; first 13M operations/month included; next 88M "
        "(13M-100M) ¥5.21 per million; next 2,400M ¥3.20 per million; over 2,500M ¥1.27 "
        "per million (tax-inclusive; 744 hours a month)",
        "Azure operated by 21Vianet (China), in CNY: the only Service Bus prices found",
    ),
    "dts_billing": Source(
        "https://learn.microsoft.com/azure/azure-functions/durable/durable-task-scheduler/"
        "durable-task-scheduler-billing",
        "An action is a message dispatched by the Durable Task Scheduler to your application: "
        "starting an orchestration, starting an activity, completing a timer, triggering an external "
        "event, processing the result of an activity ...; an activity uses two actions (scheduling, "
        "processing the result). Dedicated: each CU supports up to 2,000 actions per second (up to "
        "three CUs). Consumption: up to 500 actions per second. Month: 2,628,000 seconds",
        "price per CU and per action: NOT FOUND in the stored docs ('see the pricing page')",
    ),
    "durable_billing": Source(
        "https://learn.microsoft.com/azure/azure-functions/durable/durable-functions-billing",
        "Each replay is viewed by the Azure Functions runtime as a distinct function invocation",
        "Azure Storage backend: transactions billed to your storage account; no per-episode figure is published",
    ),
    "durable_azure_storage": Source(
        "https://learn.microsoft.com/azure/azure-functions/durable/durable-functions-azure-storage-provider",
        "all function execution is driven by Azure Storage queues (one work-item queue for "
        "activity messages, control queues for instance messages); Tables store history "
        "(new rows as an instance runs; loaded by a range query when it replays) and "
        "instance state; blobs and blob leases distribute partitions",
        "transactions per order are OUR MODEL from these components (`storage_model`), "
        "not measured and not published; queue polling and lease renewals are left out",
    ),
    "functions_pricing": Source(
        "https://azure.microsoft.com/pricing/details/functions/",
        "Executions are counted each time a function is executed in response to an event, triggered by a binding",
        "Flex Consumption USD prices NOT FOUND in the stored docs: the stored page shows '$-'",
    ),
}


@dataclass(frozen=True)
class Price:
    value: float
    unit: str
    currency: str
    source: str  # key of SOURCES


PRICES: dict[str, Price] = {
    "cosmos_serverless_per_million_ru": Price(0.25, "per million RU", "USD", "cosmos_prices"),
    "cosmos_manual_per_100rus_hour": Price(0.008, "per 100 RU/s per hour", "USD", "cosmos_autoscale"),
    "cosmos_autoscale_per_100rus_hour": Price(0.012, "per 100 RU/s per hour", "USD", "cosmos_autoscale"),
    "servicebus_cn_base_hour": Price(0.0851, "per hour (Standard base)", "CNY", "servicebus_pricing_cn"),
}
HOURS_PER_MONTH = MONTH_S / 3600
COSMOS_MANUAL_MIN_RUS = 400
COSMOS_AUTOSCALE_STEP = 1000
COSMOS_SERVERLESS_PARTITION_RUS = 5000
# Service Bus Standard operations tiers: (ops up to, price per million); None = not found. Tier bounds from the
# pricing page; CNY prices from azure.cn (its second tier reads "Next 88M", the global page "Next 87M": same bound).
SERVICEBUS_TIERS_CN: tuple[tuple[float, float], ...] = ((13e6, 0.0), (100e6, 5.21), (2_500e6, 3.20), (math.inf, 1.27))
SERVICEBUS_CREDITS_PER_S = 1000
DTS_ACTIONS_PER_CU_S = 2000
DTS_MAX_CUS = 3
DTS_CONSUMPTION_MAX_ACTIONS_S = 500

# RU per operation (1 KB items): published where a figure exists, our rule of thumb otherwise (SOURCES says which).
RU_RULES: dict[str, float] = {
    "point_read": 1.0,  # cosmos_point_read
    "create": 5.5,  # cosmos_write ("without indexing": a floor)
    "replace": 11.0,  # cosmos_write: twice an insert
    "upsert": 5.5,  # the recovery index's entries are new ids (<orderId>|<completeBy>): an insert
    "delete": 5.5,  # not published: taken as an insert
    "query_single": 3.0,  # cosmos_query rule of thumb (+ RU_PER_ITEM_RETURNED)
    "query_cross": 3.0,  # the same per physical partition (one here)
    "count_cross": 3.0,
}
RU_PER_ITEM_RETURNED = 1.0
QUERY_KINDS = ("query_single", "query_cross", "count_cross")
