"""Drives the payments example with the real, unmodified Stripe Python SDK.

Usage: create_intents.py BASE_URL COUNT TIMEOUT_SECONDS

Creates COUNT payment intents, each with one SDK call. The SDK picks its own Idempotency-Key for
each call, sends form bodies, times out after TIMEOUT_SECONDS and retries timeouts, 409 and 5xx
by itself. Prints one JSON line per call: the intent id and amount the SDK returned, and how many
requests the SDK sent for it (counted by a wrapper around its HTTP client).
"""

import json
import sys

import stripe
from stripe._http_client import RequestsClient


class CountingClient(RequestsClient):
    """The SDK's own requests client, counting what it sends."""

    sent = 0

    def request(self, method, url, headers, post_data=None):
        CountingClient.sent += 1
        return super().request(method, url, headers, post_data)


def main():
    base, count, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    client = stripe.StripeClient(
        "sk_test_idem_sdk",
        base_addresses={"api": base},
        max_network_retries=12,
        http_client=CountingClient(timeout=timeout),
    )
    for n in range(count):
        before = CountingClient.sent
        intent = client.v1.payment_intents.create(
            params={
                "amount": 500 + n,
                "currency": "eur",
                "customer": "cus_sdk",
                "metadata": {"n": str(n)},
            }
        )
        print(json.dumps({"id": intent.id, "amount": intent.amount, "requests": CountingClient.sent - before}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
