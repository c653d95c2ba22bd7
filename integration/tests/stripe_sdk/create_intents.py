"""Drives the payments example with the real, unmodified Stripe Python SDK.

Usage:
  create_intents.py create BASE_URL COUNT TIMEOUT_SECONDS
  create_intents.py reuse BASE_URL
  create_intents.py concurrent BASE_URL

create: creates COUNT payment intents, each with one SDK call. The SDK picks its own
Idempotency-Key for each call, sends form bodies, times out after TIMEOUT_SECONDS and retries
timeouts, 409 and 5xx by itself. Prints one JSON line per call: the intent id and amount the SDK
returned, and how many requests the SDK sent for it (counted by a wrapper around its HTTP client).

reuse: creates an intent with an explicit key, then sends the same key with another amount.
Prints the first intent, then which exception the SDK raised for the reuse, with its status.

concurrent: creates an intent with an explicit key and, while the server still works on it,
the same request again from a second thread. Prints both intents and the statuses the second
call's requests received (409 while the first runs, retried by the SDK, then the replay).
"""

import json
import sys
import threading
import time

import stripe
from stripe._http_client import RequestsClient


class CountingClient(RequestsClient):
    """The SDK's own requests client, counting what it sends and noting each answer's status
    per thread."""

    sent = 0
    statuses = {}

    def request(self, method, url, headers, post_data=None):
        CountingClient.sent += 1
        answer = super().request(method, url, headers, post_data)
        CountingClient.statuses.setdefault(threading.current_thread().name, []).append(answer[1])
        return answer


def client(base, timeout, retries=12):
    return stripe.StripeClient(
        "sk_test_idem_sdk",
        base_addresses={"api": base},
        max_network_retries=retries,
        http_client=CountingClient(timeout=timeout),
    )


def params(amount, n=0):
    return {"amount": amount, "currency": "eur", "customer": "cus_sdk", "metadata": {"n": str(n)}}


def create(base, count, timeout):
    sdk = client(base, timeout)
    for n in range(count):
        before = CountingClient.sent
        intent = sdk.v1.payment_intents.create(params=params(500 + n, n))
        print(json.dumps({"id": intent.id, "amount": intent.amount, "requests": CountingClient.sent - before}))
        sys.stdout.flush()


def reuse(base):
    sdk = client(base, 5.0)
    options = {"idempotency_key": "sdk-reuse-1"}
    first = sdk.v1.payment_intents.create(params=params(500), options=options)
    print(json.dumps({"id": first.id, "amount": first.amount}))
    try:
        sdk.v1.payment_intents.create(params=params(600), options=options)
        print(json.dumps({"raised": None}))
    except stripe.StripeError as e:
        print(json.dumps({"raised": type(e).__name__, "status": e.http_status, "message": e.user_message}))


def concurrent(base):
    sdk = client(base, 10.0)
    options = {"idempotency_key": "sdk-concurrent-1"}
    answers = {}

    def call(name):
        answers[name] = sdk.v1.payment_intents.create(params=params(700), options=options).id

    first = threading.Thread(target=call, args=("first",), name="first")
    second = threading.Thread(target=call, args=("second",), name="second")
    first.start()
    time.sleep(0.3)
    second.start()
    first.join()
    second.join()
    print(json.dumps({
        "first": answers.get("first"),
        "second": answers.get("second"),
        "second_statuses": CountingClient.statuses.get("second", []),
    }))


def main():
    mode, base = sys.argv[1], sys.argv[2]
    if mode == "create":
        create(base, int(sys.argv[3]), float(sys.argv[4]))
    elif mode == "reuse":
        reuse(base)
    elif mode == "concurrent":
        concurrent(base)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
