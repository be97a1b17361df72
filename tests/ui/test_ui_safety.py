"""Safe by default: loopback, read-only, runs under the root only, names as text, JSON only."""

from __future__ import annotations

import json
import os

import pytest
from ui_runs import Server

from layerscope.cli import build_parser
from layerscope.ui import _server
from layerscope.ui._app import CONTENT_SECURITY_POLICY, is_loopback

ESCAPES = [
    "/api/runs/..",
    "/api/runs/%2e%2e",
    "/api/runs/..%2fexp1",
    "/api/runs/..%2F..%2Fetc",
    "/api/runs/%2fetc",
    "/api/runs/%2Fetc%2Fpasswd",
    "/api/runs/exp1%2f..%2fexp2",
    "/api/runs/exp1%2F",
    "/api/runs/%2e",
    "/api/runs/.",
    "/api/runs/exp1%00",
    "/api/runs/%5c..%5cexp1",
    "/api/runs/..%5cexp1",
    "/api/runs//etc/heatmap",
    "/api/runs/..%2fruns%2fexp1/heatmap",
    "/api/runs/%2e%2e/heatmap",
    "/static/..%2f_app.py",
    "/static/index.html",
    "/static/%2fetc%2fpasswd",
    "/static/../../_app.py",
]


@pytest.mark.parametrize("path", ESCAPES)
def test_names_that_leave_the_root_are_refused(server, path):
    status, _, body = server.get(path)
    assert status in (400, 404), (path, status)
    assert b"root:x:" not in body
    assert b"import" not in body


def test_a_link_out_of_the_root_is_not_served(runs_root, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(runs_root / "exp1", root / "linked")  # a run elsewhere, linked in
    os.symlink(runs_root / "exp2", root / "local")
    (root / "inside").symlink_to(root / "local")  # a link that stays inside is fine
    with Server(root) as server:
        assert server.get("/api/runs/linked")[0] == 404
        assert server.get("/api/runs/linked/heatmap")[0] == 404
        listed = [run["id"] for run in server.json("/api/runs")["runs"]]
        assert "linked" not in listed
        assert "local" not in listed
        assert server.get("/api/runs/exp1")[0] == 404


def test_only_get(server):
    for method in ["POST", "PUT", "DELETE", "PATCH"]:
        assert server.get("/api/runs", method=method)[0] == 405
        assert server.get("/api/runs/exp1/heatmap", method=method)[0] == 405
        assert server.get("/", method=method)[0] == 405


def test_requests_for_other_host_names_are_refused(server):
    # A page elsewhere that points its own name at 127.0.0.1 (DNS rebinding) gets nothing.
    assert server.get("/api/runs", headers={"Host": "attacker.example"})[0] == 400
    assert server.get("/api/runs", headers={"Host": f"localhost:{server.port}"})[0] == 200


def test_every_answer_carries_the_security_headers(server):
    for path in ["/", "/api/runs", "/static/app.js", "/static/base.js", "/api/runs/nope"]:
        _, headers, _ = server.get(path)
        assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self';" in CONTENT_SECURITY_POLICY  # no inline script, no eval


def test_answers_are_json_never_pickles(server):
    for path in ["/api/runs", "/api/runs/exp1", "/api/runs/exp1/heatmap", "/api/runs/nope"]:
        _, headers, body = server.get(path)
        assert headers["content-type"] == "application/json"
        json.loads(body)


def test_the_page_builds_no_html_from_data():
    from layerscope.ui import _assets

    script = "\n".join(_assets.text(name) for name in _assets.SCRIPTS)
    for sink in [".innerHTML", ".outerHTML", "insertAdjacentHTML", "document.write", "eval("]:
        assert sink not in script
    assert "new Function" not in script


def test_serve_binds_loopback_unless_told(monkeypatch, runs_root, capsys):
    args = build_parser().parse_args(["serve", str(runs_root)])
    assert (args.host, args.port) == ("127.0.0.1", 8765)
    bound = []

    def run(server, sockets):
        bound.append((server.config.host, *sockets[0].getsockname()[:2]))

    monkeypatch.setattr("uvicorn.Server.run", run)
    _server.serve(runs_root, port=0)
    assert bound[-1][:2] == ("127.0.0.1", "127.0.0.1")
    assert "warning" not in capsys.readouterr().err
    _server.serve(runs_root, host="0.0.0.0", port=0)
    assert bound[-1][:2] == ("0.0.0.0", "0.0.0.0")
    assert "warning: serving" in capsys.readouterr().err


def test_loopback_addresses():
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("127.0.0.2")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("::")
    assert not is_loopback("10.0.0.1")
    assert not is_loopback("example.com")
