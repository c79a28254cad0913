"""A local stand-in for the Hugging Face hub: the few endpoints ``HfApi.create_repo`` and ``HfApi.upload_folder`` call.

* ``POST /api/repos/create``: records the repository (and its visibility);
* ``POST /api/models/<repo>/preupload/<revision>``: answers ``regular`` for every file, so the files travel inside
  the commit itself (no LFS or Xet storage to stand in for);
* ``POST /api/models/<repo>/commit/<revision>``: reads the commit (newline-delimited JSON), stores each file's bytes;
* ``POST /api/validate-yaml``: accepts the model card's metadata.

Anything else is answered 404 and recorded, so that a test sees a call the stand-in does not know. The real client
runs against it unchanged: ``HF_ENDPOINT`` points at it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class HubRecord:
    """What the stand-in was asked to do."""

    repos: dict[str, dict] = field(default_factory=dict)  # repo id -> the create_repo payload
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo id -> {path: bytes}
    commits: list[dict] = field(default_factory=list)  # each commit's header
    tokens: set[str] = field(default_factory=set)  # Authorization headers seen
    unknown: list[str] = field(default_factory=list)  # requests the stand-in does not serve


_PREUPLOAD = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/?]+)")
_COMMIT = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/?]+)")


def _handler(record: HubRecord, base: list[str]):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self) -> None:  # noqa: N802
            record.unknown.append(f"GET {self.path}")
            self._reply(404, {"error": "not served by the stand-in"})

        def do_POST(self) -> None:  # noqa: N802
            record.tokens.add(self.headers.get("Authorization", ""))
            body = self._body()
            if self.path == "/api/repos/create":
                payload = json.loads(body)
                repo = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
                if repo in record.repos:
                    self._reply(409, {"error": "You already created this model repo", "url": f"{base[0]}/{repo}"})
                    return
                record.repos[repo] = payload
                self._reply(200, {"url": f"{base[0]}/{repo}"})
            elif self.path == "/api/validate-yaml":
                self._reply(200, {"errors": [], "warnings": []})
            elif found := _PREUPLOAD.match(self.path):
                files = json.loads(body)["files"]
                self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                                             "oid": None} for f in files]})
            elif found := _COMMIT.match(self.path):
                repo = found["repo"]
                if repo not in record.repos:
                    self._reply(404, {"error": f"Repository {repo} not found"})
                    return
                stored = record.files.setdefault(repo, {})
                for line in body.decode().splitlines():
                    item = json.loads(line)
                    if item["key"] == "header":
                        record.commits.append(item["value"])
                    elif item["key"] == "file":
                        stored[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    else:
                        record.unknown.append(f"commit item {item['key']}")
                oid = hashlib.sha1(json.dumps(sorted(stored)).encode()).hexdigest()
                self._reply(200, {"commitUrl": f"{base[0]}/{repo}/commit/{oid}", "commitOid": oid})
            else:
                record.unknown.append(f"POST {self.path}")
                self._reply(404, {"error": "not served by the stand-in"})

    return Handler


class HubStandIn:
    """``with HubStandIn() as hub:`` serves on ``hub.url`` (127.0.0.1, a free port) from a thread; ``hub.record``."""

    def __init__(self) -> None:
        self.record = HubRecord()
        base: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.record, base))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        base.append(self.url)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "HubStandIn":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
