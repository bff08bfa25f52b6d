"""A client written from SPEC.md alone, with Python `requests` on ONE kept-alive session.

Usage: spec_client.py API_BASE   (API_BASE ends in /api/v1)

It walks the README's flows and SPEC's endpoints: register, log in (identifier, username, email),
generate a key, encrypt and decrypt through jobs, rotate, shares, managed API keys, profile, audit logs,
team access, health. After every call it checks that the answer is the one meant for its request: not an
informational (1xx) answer, the X-Request-Id it sent echoed back (as X-Client-Request-Id: the service's
own id is X-Request-Id), the status expected, and a body field
that ties the answer to what was asked. Plain asserts; the first failure stops the run with its story.
"""

import hashlib
import os
import sys
import time
import uuid

import requests

BASE = sys.argv[1].rstrip("/")
SESSION = requests.Session()
SESSION.headers["User-Agent"] = "spec-client-python/1 requests/" + requests.__version__
CALLS = []


def call(method, path, expect, token=None, **kwargs):
    """One request on the shared session; returns the response once it is known to be this request's."""
    rid = "py-" + uuid.uuid4().hex
    headers = dict(kwargs.pop("headers", {}))
    headers["X-Request-Id"] = rid
    if token:
        headers["Authorization"] = "Bearer " + token
    res = SESSION.request(method, BASE + path, headers=headers, timeout=60, **kwargs)
    story = "%s %s -> %s %s" % (method, path, res.status_code, res.text[:400])
    CALLS.append("%s %s %s" % (method, path, res.status_code))
    assert res.status_code >= 200, "an informational answer was taken as final: " + story
    echoed = res.headers.get("X-Client-Request-Id")
    assert echoed == rid, "the answer belongs to another request (X-Client-Request-Id %r, sent %r): %s" % (echoed, rid, story)
    expected = expect if isinstance(expect, (list, tuple)) else [expect]
    assert res.status_code in expected, "expected %s: %s" % (expected, story)
    return res


def json_of(res):
    assert "json" in res.headers.get("Content-Type", ""), "not JSON: %s" % res.headers.get("Content-Type")
    return res.json()


def wait_job(token, job):
    """Polls the job (Prefer: wait) until it ends; the same job id each time."""
    job_id = job["job_id"]
    deadline = time.time() + 120
    while job["state"] not in ("completed", "failed"):
        assert time.time() < deadline, "job %s still %s" % (job_id, job["state"])
        job = json_of(call("GET", "/jobs/" + job_id, 200, token, headers={"Prefer": "wait=5"}))
        assert job["job_id"] == job_id, job
    assert job["state"] == "completed", job
    return job


def download(token, job):
    files = job["result"]["files"]
    assert len(files) == 1, files
    res = call("GET", "/jobs/%s/files/%d" % (job["job_id"], files[0]["n"]), 200, token)
    return res.content


def main():
    n = uuid.uuid4().hex[:10]
    user = {"username": "py_" + n, "email": "py_%s@example.test" % n, "password": "correct horse battery"}

    # Health, public.
    health = json_of(call("GET", "/health", 200))
    assert health["status"] in ("ok", "degraded") and "postgres" in health["checks"], health

    # Register a partner account: a session and a partner API key.
    reg = json_of(call("POST", "/partners/register", 201, json=dict(user, company_name="Py Co")))
    assert reg["user"]["username"] == user["username"], reg
    token = reg["session"]["token"]
    user_id = reg["user"]["user_id"]

    me = json_of(call("GET", "/auth/me", 200, token))
    assert me["username"] == user["username"] and me["email"] == user["email"], me

    # Log in by SPEC's words: username or email plus password (and the identifier form).
    for field, value in (("identifier", user["username"]), ("username", user["username"]), ("email", user["email"])):
        session = json_of(call("POST", "/auth/login", 200, json={field: value, "password": user["password"]}))
        assert session["user"]["username"] == user["username"], (field, session)
        token = session["session"]["token"]
        me = json_of(call("GET", "/auth/me", 200, token))
        assert me["username"] == user["username"], me
    bad = json_of(call("POST", "/auth/login", 401, json={"email": user["email"], "password": "wrong password!"}))
    assert bad["status"] == 401, bad

    # A field the route does not name is refused, not dropped.
    unknown = json_of(call("GET", "/keys/list?colour=blue", 422, token))
    assert any(e["path"] == "query.colour" for e in unknown["errors"]), unknown

    # Generate a key (multipart form), with the sample's own field name for the environment.
    passphrase = "a long passphrase for python"
    form = {"label": "py-main", "env": "staging", "name": "Py Example", "email": user["email"], "passphrase": passphrase}
    key = json_of(call("POST", "/keys/generate-key", 201, token, files={k: (None, v) for k, v in form.items()}))
    assert key["label"] == "py-main" and key["environment"] == "staging", key
    fingerprint = key["fingerprint"]

    listed = json_of(call("GET", "/keys/list?environment=staging&page_size=10", 200, token))
    assert [k["fingerprint"] for k in listed["items"]] == [fingerprint], listed
    assert listed["page_size"] == 10 and listed["total"] == 1, listed
    too_big = json_of(call("GET", "/keys/list?page_size=1000", 422, token))
    assert "at most" in too_big["errors"][0]["message"], too_big

    public = json_of(call("POST", "/keys/get-public-key", 200, token, json={"fingerprint": fingerprint}))
    assert public["fingerprint"] == fingerprint and "BEGIN PGP PUBLIC KEY BLOCK" in public["public_key"], public

    # Encrypt and decrypt through jobs; the next request on the session gets its own answer.
    plaintext = os.urandom(50_000)
    enc = json_of(call("POST", "/keys/encrypt", (200, 202), token, data={"fingerprint": fingerprint}, files={"files": ("data.bin", plaintext, "application/octet-stream")}))
    assert enc["kind"] == "encrypt", enc
    me = json_of(call("GET", "/auth/me", 200, token))
    assert me["username"] == user["username"], me
    enc = wait_job(token, enc)
    ciphertext = download(token, enc)
    assert ciphertext != plaintext and len(ciphertext) > 0

    dec = json_of(call("POST", "/keys/decrypt", (200, 202), token, data={"fingerprint": fingerprint, "passphrase": passphrase}, files={"files": ("data.bin.gpg", ciphertext, "application/octet-stream")}))
    assert dec["kind"] == "decrypt", dec
    dec = wait_job(token, dec)
    assert hashlib.sha256(download(token, dec)).hexdigest() == hashlib.sha256(plaintext).hexdigest()

    # Rotation: now, on a schedule, and its history.
    rot = json_of(call("POST", "/keys/%s/rotate" % fingerprint, (200, 202), token, json={}))
    assert rot["kind"] == "rotate-key", rot
    wait_job(token, rot)
    schedule = json_of(call("POST", "/keys/%s/rotation-schedule" % fingerprint, 200, token, json={"rotation_interval_days": 30}))
    assert schedule["fingerprint"] != fingerprint and schedule["rotation_interval_days"] == 30, schedule
    history = json_of(call("GET", "/keys/%s/rotation-history" % fingerprint, 200, token))
    assert history["total"] >= 1 and history["items"], history
    partner_history = json_of(call("GET", "/keys/rotation-history", 200, token))
    assert partner_history["total"] >= 1, partner_history

    # Public key shares: create, list (both spellings of the path), public lookup, revoke (twice).
    share = json_of(call("POST", "/keys/share/create", 201, token, json={"fingerprint": fingerprint, "max_views": 5}))
    share_id, share_token = share["share_id"], share["share_token"]
    for path in ("/keys/share/", "/keys/share"):
        shares = json_of(call("GET", path, 200, token))
        assert [s["share_id"] for s in shares["items"]] == [share_id], shares
    looked_up = json_of(call("GET", "/keys/share/" + share_token, 200))
    assert looked_up["fingerprint"] == schedule["fingerprint"] and "BEGIN PGP PUBLIC KEY BLOCK" in looked_up["public_key"], looked_up
    call("DELETE", "/keys/share/" + share_id, 204, token)
    call("DELETE", "/keys/share/" + share_id, 204, token)
    call("GET", "/keys/share/" + share_token, (404, 410))
    analytics = json_of(call("GET", "/keys/share/analytics", 200, token))
    assert analytics["totals"]["shares"] == 1, analytics

    # Managed API keys.
    created = json_of(call("POST", "/api-keys/generate", 201, token, json={"name": "py key", "scopes": ["keys:read"]}))
    key_id = created["key_id"]
    assert created["name"] == "py key" and created["value"].startswith("kms_sk_"), created
    listed = json_of(call("GET", "/api-keys", 200, token))
    assert key_id in [k["key_id"] for k in listed["items"]], listed
    fetched = json_of(call("GET", "/api-keys/" + key_id, 200, token))
    assert fetched["key_id"] == key_id and fetched["value"] == created["value"], fetched
    as_key = json_of(call("GET", "/keys/list", 200, created["value"]))
    assert as_key["total"] == 1, as_key
    rotated = json_of(call("POST", "/api-keys/%s/rotate" % key_id, 200, token, json={}))
    assert rotated["key_id"] == key_id and rotated["value"] != created["value"], rotated
    ks = json_of(call("POST", "/api-keys/%s/share" % key_id, 201, token, json={"max_views": 1}))
    ks_id, ks_token = ks["share_id"], ks["share_token"]
    ks_list = json_of(call("GET", "/api-keys/%s/shares" % key_id, 200, token))
    assert [s["share_id"] for s in ks_list["items"]] == [ks_id], ks_list
    shared = json_of(call("GET", "/api-keys/shared/" + ks_token, 200))
    assert shared["key_id"] == key_id and shared["value"] == rotated["value"], shared
    call("DELETE", "/api-keys/shares/" + ks_id, 204, token)
    call("DELETE", "/api-keys/shares/" + ks_id, 204, token)
    call("DELETE", "/api-keys/" + key_id, 204, token)
    call("DELETE", "/api-keys/" + key_id, 204, token)
    call("GET", "/keys/list", 401, created["value"])

    # Passkeys: none yet; an unknown id is 404 (not yours), repeatable.
    passkeys = json_of(call("GET", "/auth/passkeys/list", 200, token))
    assert passkeys["total"] == 0 and passkeys["items"] == [], passkeys
    call("DELETE", "/auth/passkeys/" + str(uuid.uuid4()), 404, token)

    # Profile.
    updated = json_of(call("PUT", "/profile/update", 200, token, json={"company_name": "Py Co 2"}))
    assert updated["username"] == user["username"], updated
    api_key = json_of(call("GET", "/profile/api-key", 200, token))
    assert "expires_at" in api_key, api_key
    status = json_of(call("GET", "/partners/api-key-status", 200, token))
    assert "expires_at" in status, status
    activity = json_of(call("GET", "/profile/recent-activity", 200, token))
    assert isinstance(activity["items"], list) and activity["items"], activity
    days = json_of(call("POST", "/profile/update-rotation-days", 200, token, json={"rotation_interval_days": 90}))
    assert days["rotation_interval_days"] == 90, days
    new_password = "another horse battery"
    call("POST", "/profile/change-password", 200, token, json={"current_password": user["password"], "new_password": new_password})
    session = json_of(call("POST", "/auth/login", 200, json={"username": user["username"], "password": new_password}))
    token = session["session"]["token"]

    # Audit logs, paginated and filtered.
    audit = json_of(call("GET", "/audit-logs?page=1&page_size=5&action=sessions.login&status=success", 200, token))
    assert audit["page_size"] == 5 and audit["total"] >= 4 and all(e["action"] == "sessions.login" for e in audit["items"]), audit

    # Team access: not linked; unlinking is harmless.
    team = json_of(call("GET", "/team-access/status", 200, token))
    assert team["linked"] is False, team
    call("DELETE", "/team-access/link", 204, token)

    members = json_of(call("GET", "/team-access/members?page_size=5", 200, token))
    assert isinstance(members["items"], list) and members["page_size"] == 5, members

    # Billing, partners, monitoring (administrators only), public account recovery and contact.
    billing = json_of(call("GET", "/billing/status", 200, token))
    assert "plan" in billing, billing
    partner = json_of(call("POST", "/partners/rotate-api-key", 200, token, json={}))
    assert partner["api_key"].startswith("kms_pk_"), partner
    for path in ("/status", "/keys/health", "/keys/%s/metrics" % fingerprint):
        denied = json_of(call("GET", path, 403, token))
        assert denied["status"] == 403, denied
    accepted = json_of(call("POST", "/auth/forgot-password", 202, json={"email": user["email"]}))
    assert accepted["status"] == "accepted", accepted
    reset = json_of(call("POST", "/auth/reset-password", (400, 410), json={"token": "not-a-reset-token", "new_password": "a new long password"}))
    assert reset["code"] in ("invalid_reset_token", "reset_token_expired", "reset_token_used"), reset
    contact = json_of(call("POST", "/auth/contact", 202, json={"name": "Py", "email": user["email"], "subject": "Hello", "message": "From the Python client."}))
    assert contact["status"] == "received" and contact["reference"], contact
    begun = json_of(call("POST", "/auth/passkeys/login/begin", 200, json={"username": user["username"]}))
    assert begun["challenge_id"] and begun["options"]["challenge"], begun

    # Disable the key: listed as disabled.
    disabled = json_of(call("POST", "/keys/disable-key", 200, token, json={"fingerprint": fingerprint}))
    assert disabled["fingerprint"] in (fingerprint, schedule["fingerprint"]), disabled
    me = json_of(call("GET", "/auth/me", 200, token))
    assert me["user_id"] == user_id, me

    # Delete the account: its sessions end.
    deleted = json_of(call("POST", "/profile/delete-account", 200, token, json={"password": new_password}))
    assert deleted["status"] == "deleted", deleted
    call("GET", "/auth/me", 401, token)

    print("ok: %d calls on one session" % len(CALLS))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as err:
        print("FAILED: %s" % err, file=sys.stderr)
        print("calls so far:\n  " + "\n  ".join(CALLS[-15:]), file=sys.stderr)
        sys.exit(1)
