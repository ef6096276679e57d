"""The endpoint diff against Flink's OpenAPI document (weir.tools.flink_rest_diff)."""

from __future__ import annotations

from weir.tools.flink_rest_diff import Operation, diff, weir_document


def test_operations_match_by_method_and_path_whatever_the_parameters_are_called() -> None:
    flink = {
        "paths": {
            "/jobs/{jobid}": {"get": {}, "patch": {}, "parameters": []},
            "/jobs/{jobid}/savepoints/{triggerid}": {"get": {}},
            "/jobs/{jobid}/vertices/{vertexid}/flamegraph": {"get": {}},  # not served by Weir
        }
    }
    result = diff(flink, weir_document())
    assert Operation("get", "/jobs/{}") in result.matched and Operation("patch", "/jobs/{}") in result.matched
    assert Operation("get", "/jobs/{}/savepoints/{}") in result.matched
    assert result.flink_only == [Operation("get", "/jobs/{}/vertices/{}/flamegraph")]
    assert Operation("get", "/healthz") in result.weir_only
