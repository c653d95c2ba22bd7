"""Powertools for AWS Lambda (Python)'s idempotency utility beside a raw redis-py baseline.

The seeds' `register_payment` made idempotent with Powertools' `idempotent_function` on its
Redis persistence layer (`CachePersistenceLayer`), against the same writes made by hand with
redis-py, on the same server, timed in alternation, one caller:

| row | Powertools' block | the raw block |
|---|---|---|
| fresh call | calls under new keys | `SET NX EX` of an in-progress record, then `SET EX` of the result |
| replay | calls under a key that completed | `GET` of the record and its JSON decoded |

Each row is the median of the rounds' ratios (the raw block's time over Powertools': the share
of the raw rate Powertools keeps, as idem's rows against its raw baselines in the benchmarks
guide) with quartiles. Every body counts its runs: the run ends with a check that each fresh
call ran its body once and no replay ran it.

    python3 peers/powertools.py redis://127.0.0.1:6379/ [--smoke]

Needs `aws-lambda-powertools` and `redis` (`.ci/run` installs them with pip under
~/.cache/idem-peers and runs the smoke form).
"""

import json
import statistics
import sys
import time
import uuid
import warnings

import redis
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyValidationError
from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

RAN = 0


def payment(args):
    global RAN
    RAN += 1
    return {
        "payment_id": f"pay_{args['run_id']}_{args['step_id']}",
        "customer": args["customer"],
        "amount_cents": args["amount_cents"],
    }


def args_of(run_id, step_id):
    return {"run_id": run_id, "step_id": step_id, "customer": "cus_42", "amount_cents": 500}


def alternating(rounds, block, powertools, raw):
    """Rounds of `block` calls a side, the side that goes first alternating, after one round
    unmeasured: the median of raw's time over Powertools' and its quartiles."""

    def timed(side, first):
        start = time.perf_counter()
        for step in range(first, first + block):
            side(step)
        return time.perf_counter() - start

    step = 0
    timed(powertools, step)
    timed(raw, step + block)
    step += 2 * block
    ratios, ours, theirs = [], [], []
    for round_ in range(rounds):
        if round_ % 2 == 0:
            p = timed(powertools, step)
            r = timed(raw, step + block)
        else:
            r = timed(raw, step)
            p = timed(powertools, step + block)
        step += 2 * block
        ratios.append(r / p)
        ours.append(block / p)
        theirs.append(block / r)
    ratios.sort()
    return {
        "rounds": rounds,
        "block": block,
        "median": statistics.median(ratios),
        "low_quartile": ratios[rounds // 4],
        "high_quartile": ratios[rounds * 3 // 4],
        "powertools_calls_per_s": statistics.median(ours),
        "raw_calls_per_s": statistics.median(theirs),
    }


def validated_replay(client, prefix):
    """Whether a replay with payload validation on (as idem always checks its fingerprint)
    answers the stored result: a message saying what happened."""
    config = IdempotencyConfig(
        event_key_jmespath='["run_id", "step_id"]',
        payload_validation_jmespath='["customer", "amount_cents"]',
    )

    @idempotent_function(
        data_keyword_argument="args",
        persistence_store=CachePersistenceLayer(client=client),
        config=config,
        key_prefix=f"{prefix}-validated",
    )
    def register_payment(args):
        return payment(args)

    register_payment(args=args_of("validated", 0))
    try:
        register_payment(args=args_of("validated", 0))
        return "a replay with payload validation on answers the stored result"
    except IdempotencyValidationError:
        return (
            "a replay with payload validation on fails (IdempotencyValidationError): the "
            "completed record lost its validation hash"
        )


def main():
    # Powertools warns at every call that no Lambda context tells it the time left.
    warnings.simplefilter("ignore")
    url = sys.argv[1]
    smoke = "--smoke" in sys.argv[2:]
    rounds, block = (3, 20) if smoke else (21, 400)
    client = redis.Redis.from_url(url)
    prefix = f"peers-{uuid.uuid4().hex}"
    layer = CachePersistenceLayer(client=client)
    # Without payload validation (Powertools' default): with it, this version's Redis layer
    # fails every replay (see `validated_replay`).
    config = IdempotencyConfig(
        event_key_jmespath='["run_id", "step_id"]',
        expires_after_seconds=24 * 3600,
    )

    @idempotent_function(
        data_keyword_argument="args",
        persistence_store=layer,
        config=config,
        key_prefix=prefix,
    )
    def register_payment(args):
        return payment(args)

    def raw_fresh(run_id, step):
        key = f"{prefix}:raw:{run_id}:{step}"
        args = args_of(run_id, step)
        record = json.dumps({"status": "INPROGRESS", "in_progress_expiration": time.time() + 60})
        assert client.set(key, record, ex=24 * 3600, nx=True)
        done = json.dumps({"status": "COMPLETED", "data": json.dumps(payment(args))})
        client.set(key, done, ex=24 * 3600)

    def raw_replay():
        record = json.loads(client.get(f"{prefix}:raw:replay:0"))
        assert record["status"] == "COMPLETED"
        return json.loads(record["data"])

    rows = []
    fresh_calls = 0
    spread = alternating(
        rounds,
        block,
        lambda step: register_payment(args=args_of("fresh", step)),
        lambda step: raw_fresh("fresh", step),
    )
    fresh_calls += (rounds + 1) * block * 2
    rows.append(("fresh call, one caller", spread))

    register_payment(args=args_of("replay", 0))
    raw_fresh("replay", 0)
    fresh_calls += 2
    spread = alternating(
        rounds,
        block,
        lambda _: register_payment(args=args_of("replay", 0)),
        lambda _: raw_replay(),
    )
    rows.append(("replay, one caller", spread))

    validated = validated_replay(client, prefix)
    fresh_calls += 1
    assert RAN == fresh_calls, f"bodies run {RAN}, fresh calls {fresh_calls}"
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)

    print("Powertools over raw redis-py writes, timed in alternation: median, quartiles, calls/s")
    for name, s in rows:
        print(
            f"  {name:<24} {s['median']:.2f} ({s['low_quartile']:.2f}–{s['high_quartile']:.2f})"
            f" ({s['rounds']} × {s['block']}); Powertools {s['powertools_calls_per_s']:.0f}/s,"
            f" raw {s['raw_calls_per_s']:.0f}/s"
        )
    print(f"  bodies run: {RAN}, one per fresh call")
    print(f"  {validated}")
    print(json.dumps([{"name": name, "spread": s} for name, s in rows]))


if __name__ == "__main__":
    main()
