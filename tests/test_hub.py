"""Models by Hugging Face Hub id: downloaded with ``huggingface_hub`` from ``HF_ENDPOINT``.

A local HTTP server here speaks the part of the Hub's API that ``snapshot_download``
uses (a revision's info, its file tree, and each file's HEAD and GET) and serves one
repository, ``tiny/coder``: the bundled target saved as a Hugging Face folder. The
command runs in a subprocess whose ``HF_ENDPOINT`` is the server (the suite itself is
offline, ``HF_HUB_OFFLINE=1``): ``--model tiny/coder`` downloads it into the Hub's cache
and decodes what the local folder decodes; a second run, offline, reads the cache; an
unknown repository is one clear error.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = "tiny/coder"
COMMIT = "c" * 40


def _handler(folder: Path, requests: list[str]):
    class Hub(BaseHTTPRequestHandler):
        def log_message(self, *args):
            requests.append(f"{self.command} {self.path}")

        def _send(self, code: int, body: bytes = b"", headers=()):
            self.send_response(code)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            path = self.path.split("?")[0]
            files = sorted(p.name for p in folder.iterdir())
            json_type = [("Content-Type", "application/json")]
            if path.startswith(f"/api/models/{REPO}/tree/"):
                tree = [
                    {
                        "type": "file",
                        "path": f,
                        "size": (folder / f).stat().st_size,
                        "oid": hashlib.sha1((folder / f).read_bytes()).hexdigest(),
                    }
                    for f in files
                ]
                return self._send(200, json.dumps(tree).encode(), json_type)
            if path.startswith(f"/api/models/{REPO}/revision/"):
                info = {"id": REPO, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]}
                return self._send(200, json.dumps(info).encode(), json_type)
            prefix = f"/{REPO}/resolve/"
            if path.startswith(prefix):
                name = path[len(prefix) :].split("/", 1)[1]
                if name not in files:
                    return self._send(404, b"", [("X-Error-Code", "EntryNotFound")])
                data = (folder / name).read_bytes()
                etag = f'"{hashlib.sha256(data).hexdigest()}"'
                return self._send(200, data, [("X-Repo-Commit", COMMIT), ("ETag", etag)])
            return self._send(404, b"", [("X-Error-Code", "RepoNotFound")])

    return Hub


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """``(endpoint, local folder, requests)`` of a Hub serving the bundled target."""
    import specjax

    folder = tmp_path_factory.mktemp("repo") / "coder"
    target, _, _ = specjax.default_pair()
    specjax.save_pretrained(target, folder)
    requests: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(folder, requests))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", folder, requests
    server.shutdown()


def _generate(model: str, env: dict) -> subprocess.CompletedProcess:
    flags = "--drafter lookup --gamma 2 --max-new-tokens 6 --json --no-eos".split()
    args = ["generate", "def add(a, b):", "--model", model, *flags]
    return subprocess.run(
        [sys.executable, "-m", "specjax.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.mark.slow
def test_a_hub_id_downloads_once_and_decodes_as_the_folder(hub, tmp_path):
    endpoint, folder, requests = hub
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env |= {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "NO_COLOR": "1"}
    online = _generate(REPO, env)
    assert online.returncode == 0, online.stderr
    assert any(r.startswith("GET /api/models/tiny/coder/tree/") for r in requests)
    assert any(r.endswith("/model.safetensors") for r in requests)
    local = _generate(str(folder), env)
    assert json.loads(online.stdout)["token_ids"] == json.loads(local.stdout)["token_ids"]
    offline = _generate(REPO, env | {"HF_HUB_OFFLINE": "1"})  # the Hub's cache, no server
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["token_ids"] == json.loads(local.stdout)["token_ids"]
    missing = _generate("tiny/nothing", env)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "tiny/nothing: no such model on the Hub" in missing.stderr, missing.stderr
