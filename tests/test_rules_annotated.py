"""Rule tables of descriptor sets, read from google.api.field_behavior annotations."""

from __future__ import annotations

import io
import subprocess
import sys

from google.protobuf.internal import api_implementation

from plugproxy.api import Call, LazyMessage, Runtime
from plugproxy.core.log import Logger
from plugproxy.core.sampling import SAMPLE_MIN_BYTES
from plugproxy.rules import annotated
from plugproxy.rules.engine import CO, compile_table
from plugproxy.spec.registry import Registry
from plugproxy.stages.validate import ValidateStage
from tests.support import VAULT, build_descriptor_set, vault_descriptor_set

EXPECTED = {
    f"{VAULT}.Secret": ("name",),
    # zone is REQUIRED inside a oneof of two: not on its own, so left out.
    f"{VAULT}.PutSecretRequest": ("vault", "secret", "ttl_days", "replicas"),
    f"{VAULT}.GetSecretRequest": ("name",),
    f"{VAULT}.ListSecretsRequest": ("vault",),
}


def _vault():
    return Registry([], [vault_descriptor_set()]).specs[VAULT]


def test_required_fields_come_from_the_sets_own_pool():
    assert annotated.required_fields(_vault()) == EXPECTED


def test_the_annotation_resolves_with_upb_when_no_generated_module_knows_it():
    # In a fresh process nothing imported google/api/field_behavior_pb2: the option bytes are
    # all the descriptors carry, and the set's own pool must be what resolves them.
    code = (
        "import sys; from plugproxy.spec.registry import Registry; from plugproxy.rules import"
        " annotated; spec = Registry([], [sys.argv[1]]).specs[sys.argv[2]];"
        " assert 'google.api.field_behavior_pb2' not in sys.modules;"
        " from google.protobuf.internal import api_implementation as a;"
        " print(a.Type(), sorted(annotated.required_fields(spec).items()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, vault_descriptor_set(), VAULT],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.strip() == f"{api_implementation.Type()} {sorted(EXPECTED.items())}"


def test_rules_are_named_after_the_spec_and_cite_the_proto_file():
    rules = {r.id: r for r in annotated.rules_for(_vault())}
    assert set(rules) == {f"{VAULT}.{suffix}" for suffix in annotated.RULE_SUFFIXES}
    required = rules[f"{VAULT}.required-field"]
    assert required.section_for("PutSecret") == (
        "acme/vault/v1/vault.proto §PutSecret (google.api.field_behavior = REQUIRED, AIP-203)"
    )
    assert required.reject_code == "INVALID_ARGUMENT"


def test_the_compiled_table_judges_with_proto3_presence():
    spec = _vault()
    compiled = compile_table(annotated.table_for(spec), spec)
    put = spec.message_class(f"{VAULT}.PutSecretRequest")
    found = compiled.check_message(put())
    assert [(v.rule.id, v.field) for v in found] == [
        (f"{VAULT}.required-field", "vault"),
        (f"{VAULT}.required-field", "secret"),
        (f"{VAULT}.required-field", "ttl_days"),  # optional: unset is missing, 0 is not
    ]
    assert all(v.party in ("", CO) for v in found)
    nested = compiled.check_message(put(vault="v", secret={}, ttl_days=0, replicas=0))
    assert [(v.field, v.message) for v in nested] == [
        ("secret.name", "secret.name is REQUIRED but empty")
    ]
    # Only REQUIRED annotations make rules: no size limits or formats of the bundled specs.
    long = "x" * 10_000
    assert compiled.check_message(put(vault=long, secret={"name": long}, ttl_days=1)) == []


def test_a_set_without_the_annotation_has_no_required_fields(tmp_path):
    files = {
        "plain.proto": 'syntax = "proto3";\npackage plain.v1;\nservice S { rpc M(X) '
        "returns (X); }\nmessage X { string a = 1 [debug_redact = true]; }\n"
    }
    reg = Registry([], [build_descriptor_set(tmp_path, files)])
    spec = reg.specs["plain.v1"]
    assert spec.field_options_class is None  # descriptor.proto is not even in the set
    assert annotated.required_fields(spec) == {}
    assert spec.is_secret_field(spec.descriptor("plain.v1.X").fields_by_name["a"])


SHELF_PROTO = """
syntax = "proto3";
package acme.shelf.v1;

import "google/api/field_behavior.proto";

service Shelf {
  rpc ListBooks(ListBooksRequest) returns (ListBooksResponse);
}

message ListBooksRequest {}

message Book {
  string title = 1 [(google.api.field_behavior) = REQUIRED];
  string blurb = 2;
}

message ListBooksResponse {
  repeated Book books = 1 [(google.api.field_behavior) = REQUIRED];
}
"""


def test_a_required_list_judged_again_from_known_entries_is_not_found_empty(tmp_path):
    """A long page listed again is judged only on entries not found clean before; the
    REQUIRED list itself is still seen holding entries, and a bad entry still reported."""
    registry = Registry(
        [], [build_descriptor_set(tmp_path, {"acme/shelf/v1/shelf.proto": SHELF_PROTO})]
    )
    runtime = Runtime(registry=registry, upstream=None, logger=Logger(io.StringIO()), metrics=None)
    stage = ValidateStage(runtime, "audit", {})
    info = registry.lookup("/acme.shelf.v1.Shelf/ListBooks")

    def judged(titles: list[str]) -> list[str]:
        page = info.response_class()
        for title in titles:
            page.books.add(title=title, blurb="b" * 60)
        response = LazyMessage(page.SerializeToString(), info.response_class)
        assert len(response.raw) >= SAMPLE_MIN_BYTES and response.sample is not None
        call = Call(info, (), [], None)
        call.request = LazyMessage(b"", info.request_class)
        assert stage.on_start(call) is None
        call.response = response
        stage.on_response(call, response)
        stage.on_finish(call)
        return [str(e.attributes["field"]) for e in call.events if e.name == "violation"]

    titles = [f"book {i}" for i in range(2_000)]
    # By the third listing every sampled entry is known clean.
    assert [judged(titles) for _ in range(4)] == [[]] * 4
    assert judged([*titles[:-1], ""]) == ["books[1999].title"]
