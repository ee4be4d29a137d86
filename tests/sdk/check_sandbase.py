"""Sandbase's quick start, unchanged but for its base URL, key and the
package it prints (pandas is not in the test image): run by
tests/tests/sandbase.rs with `requests` from PyPI. WARREN_URL is the
gateway, WARREN_KEY a Warren API key, WARREN_OTHER_KEY another key's.
Prints "ok sandbase" when every check passed."""

import os

import requests

BASE = os.environ["WARREN_URL"]
HEADERS = {"Authorization": "Bearer " + os.environ["WARREN_KEY"]}

# 1. Create a sandbox
sandbox = requests.post(f"{BASE}/sandboxes", headers=HEADERS, json={
    "templateID": "code_interpreter",
    "timeout": 300
}).json()

sandbox_id = sandbox["sandboxID"]

# 2. Execute code
result = requests.post(f"{BASE}/sandboxes/{sandbox_id}/processes", headers=HEADERS, json={
    "cmd": "python3",
    "args": ["-c", "import json; print(json.__name__)"]
}).json()

print(result["stdout"])
assert (result["stdout"], result["exitCode"]) == ("json\n", 0), result

# 3. Upload a file
with open("data.csv", "wb") as f:
    f.write(b"a,b\n1,2\n3,4\n")
up = requests.post(f"{BASE}/sandboxes/{sandbox_id}/files", headers=HEADERS,
    files={"file": ("data.csv", open("data.csv", "rb"))},
    data={"path": "/workspace/data.csv"}
)
assert up.status_code == 200, up.text

# 4. Process the file
result = requests.post(f"{BASE}/sandboxes/{sandbox_id}/processes", headers=HEADERS, json={
    "cmd": "python3",
    "args": ["-c", """
import csv
rows = list(csv.reader(open('/workspace/data.csv')))
print(f"Rows: {len(rows) - 1}, Columns: {rows[0]}")
"""]
}).json()

print(result["stdout"])
assert result["stdout"] == "Rows: 2, Columns: ['a', 'b']\n", result

# Beyond the quick start: what a user of the API does next.
r = requests.post(f"{BASE}/sandboxes/{sandbox_id}/processes", headers=HEADERS, json={"cmd": "sh", "args": ["-c", "echo out; echo err >&2; exit 3"]}).json()
assert (r["stdout"], r["stderr"], r["exitCode"]) == ("out\n", "err\n", 3), r
assert requests.get(f"{BASE}/sandboxes/{sandbox_id}/files", headers=HEADERS, params={"path": "/workspace/data.csv"}).text == "a,b\n1,2\n3,4\n"
listed = requests.get(f"{BASE}/sandboxes/{sandbox_id}/files", headers=HEADERS, params={"path": "/workspace"}).json()
assert {"name": "data.csv", "path": "/workspace/data.csv", "type": "file", "size": 12} in listed, listed
# Processes of one sandbox share it: a background server answers the next one.
requests.post(f"{BASE}/sandboxes/{sandbox_id}/processes", headers=HEADERS, json={"cmd": "sh", "args": ["-c", "echo kept > /tmp/kept"]})
assert requests.post(f"{BASE}/sandboxes/{sandbox_id}/processes", headers=HEADERS, json={"cmd": "cat", "args": ["/tmp/kept"]}).json()["stdout"] == "kept\n"
# Pause saves the home (/workspace is the home), resume brings it back.
assert requests.post(f"{BASE}/sandboxes/{sandbox_id}/pause", headers=HEADERS).status_code == 204
paused = requests.post(f"{BASE}/sandboxes/{sandbox_id}/processes", headers=HEADERS, json={"cmd": "true"})
assert paused.status_code == 409, (paused.status_code, paused.text)
assert requests.post(f"{BASE}/sandboxes/{sandbox_id}/resume", headers=HEADERS, json={"timeout": 60}).status_code == 201
r = requests.post(f"{BASE}/sandboxes/{sandbox_id}/processes", headers=HEADERS, json={"cmd": "cat", "args": ["/workspace/data.csv"]}).json()
assert r["stdout"] == "a,b\n1,2\n3,4\n", r
# Another key sees nothing of it; a wrong key is refused.
other = {"Authorization": "Bearer " + os.environ["WARREN_OTHER_KEY"]}
assert requests.post(f"{BASE}/sandboxes/{sandbox_id}/processes", headers=other, json={"cmd": "true"}).status_code == 404
assert requests.get(f"{BASE}/sandboxes/{sandbox_id}/files", headers=other, params={"path": "/workspace/data.csv"}).status_code == 404
assert requests.post(f"{BASE}/sandboxes", headers={"Authorization": "Bearer sk-wrn-nope"}, json={"templateID": "base"}).status_code == 401
assert requests.delete(f"{BASE}/sandboxes/{sandbox_id}", headers=HEADERS).status_code == 204
assert requests.post(f"{BASE}/sandboxes/{sandbox_id}/processes", headers=HEADERS, json={"cmd": "true"}).status_code == 404
print("ok sandbase")
