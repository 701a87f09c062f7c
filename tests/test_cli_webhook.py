"""`plugproxy webhook`: real AdmissionReview v1 requests over real HTTPS (trustme
certificates), JSONPatches that give exactly what `plugproxy inject` gives, bad requests
allowed with a warning, and the serving certificate reloaded when its files change.
"""

from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import http.client
import io
import json
import os
import pathlib
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonpatch
import pytest
import trustme
import yaml

from plugproxy.cli import inject, webhook
from plugproxy.cli import main as cli
from plugproxy.core.endpoints import ConfigError
from plugproxy.core.log import Logger

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
REVIEW = json.loads((FIXTURES / "webhook" / "node-pod-create.json").read_text())
IMAGE = "registry.example.com/plugproxy:0.1.0"


@dataclass
class Running:
    server: webhook.WebhookServer
    ca: trustme.CA
    cert: pathlib.Path
    key: pathlib.Path
    log: io.StringIO

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        ctx = ssl.create_default_context()
        self.ca.configure_trust(ctx)
        conn = http.client.HTTPSConnection(
            "localhost", self.server.server_address[1], context=ctx, timeout=10
        )
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def review(self, doc: Any) -> dict[str, Any]:
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        status, data = self.request("POST", "/mutate", body)
        assert status == 200
        answer = json.loads(data)
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        response: dict[str, Any] = answer["response"]
        return response

    def peer_fingerprint(self) -> str:
        ctx = ssl.create_default_context()
        self.ca.configure_trust(ctx)
        conn = http.client.HTTPSConnection(
            "localhost", self.server.server_address[1], context=ctx, timeout=10
        )
        try:
            conn.connect()
            der = conn.sock.getpeercert(binary_form=True)  # type: ignore[union-attr]
            return hashlib.sha256(der).hexdigest()
        finally:
            conn.close()


def write_cert(ca: trustme.CA, cert: pathlib.Path, key: pathlib.Path) -> trustme.LeafCert:
    leaf = ca.issue_cert("localhost", "127.0.0.1")
    for path, data in (
        (key, leaf.private_key_pem.bytes()),
        (cert, b"".join(b.bytes() for b in leaf.cert_chain_pems)),
    ):
        tmp = path.with_suffix(".new")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # each file swapped at once, as a Secret volume update does
    return leaf


def start(tmp_path: pathlib.Path, *extra: str) -> Iterator[Running]:
    ca = trustme.CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_cert(ca, cert, key)
    parser = argparse.ArgumentParser()
    webhook.add_arguments(parser)
    ns = parser.parse_args(
        [
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--image",
            IMAGE,
            *extra,
        ]
    )
    log = io.StringIO()
    server = webhook.build_server(ns, Logger(log, "json", "info"))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield Running(server, ca, cert, key, log)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def running(tmp_path: pathlib.Path) -> Iterator[Running]:
    yield from start(tmp_path)


@pytest.fixture
def fail_closed(tmp_path: pathlib.Path) -> Iterator[Running]:
    yield from start(tmp_path, "--fail-closed")


def cli_inject(
    pod: dict[str, Any], capsys: pytest.CaptureFixture[str], *extra: str
) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdin", io.StringIO(yaml.safe_dump(pod)))
        assert cli.main(["inject", "--image", IMAGE, *extra, "-"]) == 0
    out, _ = capsys.readouterr()
    result: dict[str, Any] = yaml.safe_load(out)
    return result


def apply(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(pod, ops)
    return result


def with_pod(pod: dict[str, Any]) -> dict[str, Any]:
    review = copy.deepcopy(REVIEW)
    review["request"]["object"] = pod
    return review


# ------------------------------------------------------------------------ injection


def test_patch_applied_equals_plugproxy_inject(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    response = running.review(REVIEW)
    assert response["uid"] == REVIEW["request"]["uid"]
    assert response["allowed"] is True
    pod = REVIEW["request"]["object"]
    patched = apply(pod, response)
    assert patched == cli_inject(pod, capsys)
    assert patched["spec"]["containers"][0]["name"] == "plugproxy"
    assert inject.RECORD in patched["metadata"]["annotations"]
    assert '"result":"injected"' in running.log.getvalue()


def test_proxy_user_reaches_the_patch_as_it_does_inject(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for running in start(tmp_path, "--proxy-user", "65532"):
        pod = REVIEW["request"]["object"]
        patched = apply(pod, running.review(REVIEW))
        assert patched == cli_inject(pod, capsys, "--proxy-user=65532")
        assert patched["spec"]["containers"][0]["securityContext"]["runAsUser"] == 65532


@pytest.mark.parametrize("extra", [(), ("--node-reachable-admin",)], ids=["loopback", "node"])
def test_a_hostnetwork_pod_gets_the_admin_binding_inject_gives(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...]
) -> None:
    pod = copy.deepcopy(REVIEW["request"]["object"])
    pod["spec"]["hostNetwork"] = True
    for running in start(tmp_path, *extra):
        patched = apply(pod, running.review(with_pod(pod)))
        assert patched == cli_inject(pod, capsys, *extra)
        proxy = patched["spec"]["containers"][0]
        admin = next(a for a in proxy["args"] if a.startswith("--admin-listen="))
        annotations = patched["metadata"]["annotations"]
        if extra:
            assert admin.startswith("--admin-listen=0.0.0.0:")
            assert "host" not in proxy["livenessProbe"]["httpGet"]
            assert annotations["prometheus.io/scrape"] == "true"
        else:
            assert admin.startswith("--admin-listen=127.0.0.1:")
            assert proxy["readinessProbe"]["httpGet"]["host"] == "127.0.0.1"
            assert "prometheus.io/scrape" not in annotations


def test_a_pod_from_an_injected_template_is_left_alone(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    injected = cli_inject(REVIEW["request"]["object"], capsys)
    response = running.review(with_pod(injected))
    assert response == {"uid": REVIEW["request"]["uid"], "allowed": True}


def test_pods_that_do_not_opt_in_are_not_touched(running: Running) -> None:
    pod = copy.deepcopy(REVIEW["request"]["object"])
    pod["metadata"]["annotations"]["plugproxy.io/inject"] = "false"
    assert running.review(with_pod(pod)) == {"uid": REVIEW["request"]["uid"], "allowed": True}


def test_other_kinds_and_operations_pass(running: Running) -> None:
    review = copy.deepcopy(REVIEW)
    review["request"]["operation"] = "UPDATE"
    assert "patch" not in running.review(review)
    review["request"]["operation"] = "CREATE"
    review["request"]["kind"]["kind"] = "ConfigMap"
    assert "patch" not in running.review(review)


def test_ambiguous_pod_is_allowed_with_a_warning_naming_it(running: Running) -> None:
    template = yaml.safe_load((FIXTURES / "inject" / "ambiguous-cosi.yaml").read_text())
    pod = {"metadata": {"name": "acme-cosi-0", "annotations": {"plugproxy.io/inject": "true"}}}
    pod["spec"] = template["spec"]["template"]["spec"]
    response = running.review(with_pod(pod))
    assert response["allowed"] is True
    assert "patch" not in response
    (warning,) = response["warnings"]
    assert "Pod/kube-system/acme-cosi-0" in warning  # the request's namespace
    assert "cosi-driver, objectstorage-provisioner-sidecar" in warning
    # Said which container is the driver, by annotation, the same pod is injected.
    pod["metadata"]["annotations"]["plugproxy.io/driver-container"] = "cosi-driver"
    patched = apply(pod, running.review(with_pod(pod)))
    assert patched["spec"]["containers"][0]["name"] == "plugproxy"


BAD = [
    (b"{not json", "", "not JSON"),
    (
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
        "",
        "request.uid is missing",
    ),
    (
        {**REVIEW, "apiVersion": "admission.k8s.io/v1beta1"},
        REVIEW["request"]["uid"],
        "expected an admission.k8s.io/v1",
    ),
    (
        {**REVIEW, "request": {**REVIEW["request"], "object": ["not", "a", "pod"]}},
        REVIEW["request"]["uid"],
        "not a Pod",
    ),
    (
        {
            **REVIEW,
            "request": {
                **REVIEW["request"],
                "object": {
                    **REVIEW["request"]["object"],
                    "spec": {**REVIEW["request"]["object"]["spec"], "containers": {"a": 1}},
                },
            },
        },
        REVIEW["request"]["uid"],
        "containers is not a list",
    ),
    (
        with_pod(
            {
                "metadata": {"name": "p", "annotations": {"plugproxy.io/inject": "true"}},
                "spec": {
                    "containers": [
                        {
                            "name": "x",
                            "env": [{"name": "CSI_ENDPOINT", "value": "unix:///csi/csi.sock"}],
                            "volumeMounts": "oops",
                        }
                    ]
                },
            }
        ),
        REVIEW["request"]["uid"],
        "malformed pod spec",
    ),
]


@pytest.mark.parametrize(("body", "uid", "message"), BAD)
def test_bad_requests_are_allowed_with_a_warning(
    running: Running, body: Any, uid: str, message: str
) -> None:
    response = running.review(body)
    assert response["allowed"] is True
    assert response["uid"] == uid
    assert "patch" not in response
    assert message in response["warnings"][0]


@pytest.mark.parametrize(("body", "uid", "message"), [BAD[0], BAD[3]])
def test_fail_closed_denies_them(fail_closed: Running, body: Any, uid: str, message: str) -> None:
    response = fail_closed.review(body)
    assert response["allowed"] is False
    assert message in response["status"]["message"]
    # A pod that can be injected still is.
    assert fail_closed.review(REVIEW)["allowed"] is True


def test_health_and_unknown_paths(running: Running) -> None:
    assert running.request("GET", "/healthz") == (200, b"ok\n")
    assert running.request("GET", "/other")[0] == 404
    assert running.request("POST", "/other", b"{}")[0] == 404


def test_a_client_gone_mid_request_costs_one_log_line_not_a_traceback(
    running: Running, capfd: pytest.CaptureFixture[str]
) -> None:
    ctx = ssl.create_default_context()
    running.ca.configure_trust(ctx)
    port = running.server.server_address[1]
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            tls = ctx.wrap_socket(raw, server_hostname="localhost")
            # A request line the server refuses (400), and gone before the answer is written.
            tls.sendall(b"GARBAGE / HTTP/1.1\r\n\r\n")
            tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            tls.close()
    assert running.request("GET", "/healthz") == (200, b"ok\n")  # still serving
    assert "Traceback" not in capfd.readouterr().err


# ------------------------------------------------------------------------ certificates


def test_certificate_reload_is_seen_by_the_next_handshake(running: Running) -> None:
    first = running.peer_fingerprint()
    leaf = write_cert(running.ca, running.cert, running.key)
    der = ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())
    second = running.peer_fingerprint()
    assert second != first
    assert second == hashlib.sha256(der).hexdigest()
    assert running.server.certificate.reloads == 1
    assert "tls files reloaded" in running.log.getvalue()
    # A broken update keeps the working certificate and says so once.
    running.key.write_bytes(b"garbage")
    assert running.peer_fingerprint() == second
    assert running.peer_fingerprint() == second
    assert running.log.getvalue().count("not usable yet") == 1
    assert "garbage" not in running.log.getvalue()


def test_unusable_certificate_fails_at_startup(tmp_path: pathlib.Path) -> None:
    parser = argparse.ArgumentParser()
    webhook.add_arguments(parser)
    (tmp_path / "tls.key").write_text("x")
    ns = parser.parse_args(
        ["--tls-cert", str(tmp_path / "missing.crt"), "--tls-key", str(tmp_path / "tls.key")]
    )
    with pytest.raises(ConfigError, match=r"--tls-cert .*missing.crt: no such file"):
        webhook.build_server(ns, Logger(io.StringIO()))
    ns = parser.parse_args(["--listen", "nope", "--tls-cert", "a", "--tls-key", "b"])
    with pytest.raises(ConfigError, match="--listen 'nope'"):
        webhook.build_server(ns, Logger(io.StringIO()))
    ns = parser.parse_args(["--proxy-user", "nobody", "--tls-cert", "a", "--tls-key", "b"])
    with pytest.raises(ConfigError, match="--proxy-user 'nobody': expected a numeric UID"):
        webhook.build_server(ns, Logger(io.StringIO()))


def test_the_cli_reports_bad_settings_in_one_line(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        ["webhook", "--tls-cert", str(tmp_path / "a"), "--tls-key", str(tmp_path / "b")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "no such file" in err


# ------------------------------------------------------------------------ JSONPatch


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"a": 1}, {"a": 1}),
        ({"a": 1}, {"a": True}),
        ({"a/b": {"c~d": [1, 2]}}, {"a/b": {"c~d": [1, 3], "e": None}}),
        ({"l": [{"x": 1}]}, {"l": [{"y": 1}, {"x": 1}]}),
        ({"gone": 1, "kept": {}}, {"kept": {"new": [1]}}),
    ],
)
def test_json_patch_turns_old_into_new(old: Any, new: Any) -> None:
    ops = webhook.json_patch(old, new)
    assert jsonpatch.apply_patch(old, ops) == new
    if old == new and type(old["a"]) is type(new["a"]):
        assert ops == []
