"""`--model ORG/NAME` downloads a checkpoint that is not in the local cache, as `from_pretrained`
does, from a stand-in Hub on 127.0.0.1 (`HF_ENDPOINT`); `HF_HUB_OFFLINE=1` keeps to the cache.

The stand-in answers the two kinds of request `huggingface_hub` makes: the repo's metadata
(`/api/models/ORG/NAME/revision/REV`: commit sha and file list; `.../tree/REV`: the listing) and each file (`/ORG/NAME/resolve/REV/FILE`,
HEAD then GET, with the commit and ETag headers). It serves the shipped embedded model's files.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dllm_decode.models.checkpoint import EMBEDDED_DIR, EMBEDDED_NAMES
from dllm_decode.models.hub import looks_like_repo_id

REPO = "stand-in/tiny-dllm"
SHA = "0123456789abcdef0123456789abcdef01234567"


def _files() -> dict[str, bytes]:
    folder = EMBEDDED_DIR / EMBEDDED_NAMES["embedded"]
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


class StandInHub(http.server.ThreadingHTTPServer):
    def __init__(self, files: dict[str, bytes]):
        self.files, self.requests = files, []
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(http.server.BaseHTTPRequestHandler):
    server: StandInHub

    def log_message(self, *args):                        # keep the test output clean
        pass

    def _reply(self, body: bytes, content_type: str, extra: dict[str, str] | None = None,
               send_body: bool = True) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _handle(self, send_body: bool) -> None:
        path = self.path.split("?")[0]
        self.server.requests.append((self.command, path))
        if path.startswith(f"/api/models/{REPO}/tree/"):           # the file listing
            tree = [{"type": "file", "path": name, "size": len(body),
                     "oid": hashlib.sha1(body).hexdigest()} for name, body in self.server.files.items()]
            self._reply(json.dumps(tree).encode(), "application/json", send_body=send_body)
            return
        if path.startswith(f"/api/models/{REPO}"):
            info = {"id": REPO, "modelId": REPO, "sha": SHA, "private": False,
                    "siblings": [{"rfilename": name} for name in self.server.files]}
            self._reply(json.dumps(info).encode(), "application/json", send_body=send_body)
            return
        prefix = f"/{REPO}/resolve/"
        if path.startswith(prefix):
            name = path[len(prefix):].split("/", 1)[1]
            if name in self.server.files:
                body = self.server.files[name]
                etag = '"' + hashlib.sha256(body).hexdigest() + '"'
                self._reply(body, "application/octet-stream",
                            {"X-Repo-Commit": SHA, "ETag": etag}, send_body=send_body)
                return
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.send_header("X-Error-Code", "RepoNotFound" if prefix not in path else "EntryNotFound")
        self.end_headers()

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._handle(True)

    def do_HEAD(self):  # noqa: N802
        self._handle(False)


@pytest.fixture()
def hub():
    server = StandInHub(_files())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _decode(hub: StandInHub, home: Path, *extra_env: tuple[str, str], model: str = REPO):
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_address[1]}",
           "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)
    env.update(dict(extra_env))
    return subprocess.run([sys.executable, "-m", "dllm_decode", "--model", model,
                           "--prompt", "sort : mia ella hank"],
                          capture_output=True, text=True, timeout=300, env=env)


def test_a_repo_id_downloads_then_decodes_from_the_cache(hub, tmp_path):
    first = _decode(hub, tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "ella hank mia"
    fetched = {path for method, path in hub.requests if method == "GET" and "/resolve/" in path}
    assert any(path.endswith("/model.safetensors") for path in fetched)
    assert any(path.endswith("/config.json") for path in fetched)
    hub.requests.clear()
    again = _decode(hub, tmp_path, ("HF_HUB_OFFLINE", "1"))          # cache only: no request
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "ella hank mia" and hub.requests == []


def test_offline_keeps_to_the_cache(hub, tmp_path):
    result = _decode(hub, tmp_path, ("HF_HUB_OFFLINE", "1"))
    assert result.returncode == 2
    assert "HF_HUB_OFFLINE" in result.stderr and REPO in result.stderr
    assert "Traceback" not in result.stderr and hub.requests == []


def test_an_unknown_repo_is_one_line(hub, tmp_path):
    result = _decode(hub, tmp_path, model="stand-in/no-such-model")
    assert result.returncode == 2
    assert "stand-in/no-such-model" in result.stderr and "127.0.0.1" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("text, expected", [("org/name", True), ("./org/name", False),
                                             ("/abs/dir", False), ("a/b/c", False), ("org/", False)])
def test_repo_id_shape(text, expected):
    assert looks_like_repo_id(text) is expected
