"""API fuzzing: Schemathesis generates requests from /openapi.json of the real API (SQLite in a temporary folder,
a private Redis, no worker, model and dataset roots set), valid ones and ones that break the schema, for every operation; at least 1000 are
sent and not one is answered with a 5xx. Generation is derandomized, so a failure found here is found again.

Random strings never name a model or a dataset that exists, so without help every job body would stop at
validation. Half of the valid job and plan bodies therefore get the tiny preset and a real tokens file (the rest of
the body stays generated: policy knobs, optimizer, schedule, steps, GPUs...), which takes them through the planner
and onto the queue; and a few real jobs exist from the start; half of the ids in paths are those of existing jobs.
"""

from __future__ import annotations

from collections import Counter

import pytest
from backend_support import make_settings, tiny_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]  # each runs well under 90 s; a hang fails fast
EXAMPLES = 80  # per operation and generation mode
MIN_CASES = 1000
RUNNABLE = ("POST /api/jobs", "POST /api/plan")
KNOWN_IDS = 15  # the seeded jobs and those the fuzzing creates


def runnable(case, dataset: str):
    """The generated body with a model and dataset that exist (and no output_dir: a generated absolute path would
    point a job's outputs anywhere on this machine)."""
    if isinstance(case.body, dict):
        body = {k: v for k, v in case.body.items() if k not in ("output_dir", "host")}
        data = case.body.get("data") if isinstance(case.body.get("data"), dict) else {}
        body.update(model="tiny-qwen3", seq_len=32, data={**data, "path": dataset, "format": "tokens"})
        case.body = body
    return case


@pytest.fixture(scope="module")
def settings(module_dir, redis_server):
    """Roots configured, so that the fuzzed paths go through the root checks as well."""
    return make_settings(
        module_dir / "data",
        redis_server.url,
        data_roots=str(module_dir),
        model_roots=str(module_dir / "models"),
    )


def existing_job(pair):
    """Half of the ids in paths are those of jobs that exist (generated integers rarely are)."""
    case, job_id = pair
    if job_id is not None:
        case.path_parameters = {**case.path_parameters, "job_id": job_id}
    return case


def test_fuzzed_requests_never_get_a_server_error(api, client, dataset):
    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase, given
    from hypothesis import settings as hypothesis_settings
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation import GenerationMode

    seeded = [client.post("/api/jobs", json=tiny_job(dataset)).json()["id"] for _ in range(3)]
    client.post(f"/api/jobs/{seeded[1]}/cancel")
    schema = schemathesis.openapi.from_url(api.url + "/openapi.json")
    # Creation first and deletion last, so that the operations in between find the jobs in every state.
    operations = sorted(
        (result.ok() for result in schema.get_all_operations()),
        key=lambda op: (op.label != "POST /api/jobs", op.method.upper() == "DELETE"),
    )
    assert len(operations) >= 15
    session = requests.Session()
    answers: Counter[tuple[str, int]] = Counter()
    errors: list[str] = []

    def send(label: str, case) -> None:
        request = case.as_transport_kwargs(base_url=api.url)
        try:
            # stream: an event stream answers 200 and stays open; its status is all that is checked
            resp = session.request(**request, stream=True, timeout=60)
        except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL, UnicodeError):
            return  # a request the client library itself cannot send never reaches the server
        except requests.ConnectionError as exc:  # the server dropped the connection: as bad as a 5xx
            answers[(label, 0)] += 1
            errors.append(
                f"connection lost: {request['method']} {request['url']}: {exc}\n{case.as_curl_command()}"
            )
            return
        with resp:
            answers[(label, resp.status_code)] += 1
            if resp.status_code >= 500:
                body = resp.raw.read(2000, decode_content=True).decode(errors="replace")
                errors.append(
                    f"{resp.status_code} {request['method']} {resp.url}: {body}\n{case.as_curl_command()}"
                )

    def fuzzer(operation, mode):
        strategy = operation.as_strategy(generation_mode=mode)
        if operation.label in RUNNABLE and mode is GenerationMode.POSITIVE:
            strategy = st.tuples(strategy, st.booleans()).map(
                lambda pair: runnable(pair[0], str(dataset)) if pair[1] else pair[0]
            )
        if "{job_id}" in operation.label and mode is GenerationMode.POSITIVE:
            strategy = st.tuples(strategy, st.none() | st.integers(1, KNOWN_IDS)).map(existing_job)

        @given(case=strategy)
        @hypothesis_settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case):
            send(operation.label, case)

        return fuzz

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                fuzzer(operation, mode)()
            except Unsatisfiable:
                pass  # no request of this mode exists for the operation (e.g. negative cases of a bare GET)

    total = sum(answers.values())
    by_operation = Counter(label for label, _ in answers.elements())
    assert total >= MIN_CASES, f"only {total} requests sent: {dict(by_operation)}"
    assert set(by_operation) == {op.label for op in operations}, "every operation was exercised"
    assert errors == [], f"{len(errors)} of {total} requests got a 5xx:\n" + "\n\n".join(errors[:10])
    # The fuzzing went past validation: jobs were created, planned, read, cancelled and deleted.
    reached = {key for key, n in answers.items() if n}
    for key in [("POST /api/jobs", 201), ("POST /api/plan", 200), ("GET /api/jobs/{job_id}", 200)]:
        assert key in reached, sorted(answers.items())
    assert ("DELETE /api/jobs/{job_id}", 204) in reached or ("POST /api/jobs/{job_id}/cancel", 200) in reached
