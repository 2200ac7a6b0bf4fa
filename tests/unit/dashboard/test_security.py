"""The dashboard reads only the stores it was started with, checks Host and (optionally) credentials,
and keeps exception text out of the page."""

from __future__ import annotations

import base64
import json

import pytest

from rankscope.cli.main import main
from rankscope.dashboard.app import create_app
from rankscope.dashboard.security import install
from tests.unit.dashboard.hand_store import write_hand_store

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("sec")
    inside, outside = base / "inside", base / "outside"
    write_hand_store(inside, steps=3)
    write_hand_store(outside, steps=3)
    return inside.resolve(), outside.resolve()


def _render(client, store, job, baseline=None):
    """POST the page's render callback as the browser would, with any values an attacker likes."""
    from rankscope.dashboard.app import OUTPUTS

    body = {
        "output": ".." + "...".join(OUTPUTS) + "..",
        "outputs": [{"id": o.split(".")[0], "property": o.split(".")[1]} for o in OUTPUTS],
        "inputs": [{"id": "store", "property": "value", "value": store},
                   {"id": "job", "property": "value", "value": job},
                   {"id": "tick", "property": "n_intervals", "value": 1},
                   {"id": "baseline-job", "property": "value", "value": None},
                   {"id": "retry", "property": "data", "value": 0}],
        "state": [{"id": "baseline-store", "property": "value", "value": baseline},
                  {"id": "shown", "property": "data", "value": None}],
        "changedPropIds": ["job.value"],
    }
    r = client.post("/_dash-update-component", json=body, headers={"Host": "127.0.0.1:8050"})
    assert r.status_code in (200, 204), r.data[:300]
    return json.loads(r.data)["response"] if r.status_code == 200 else {}


def test_page_reads_only_the_stores_given_at_start(stores):
    inside, outside = stores
    app = create_app(str(inside))
    install(app.server, "127.0.0.1", 8050, None)
    c = app.server.test_client()
    ok = _render(c, str(inside), "handjob")
    assert "job handjob" in ok["status"]["children"]
    for store, job in [(str(outside), "handjob"), (str(inside), "../../outside/comm_op/job=handjob"),
                       (str(inside) + "/../outside", "handjob"), (str(inside), "*")]:
        got = _render(c, store, job)
        status = got["status"]["children"]
        assert status in ("choose a store", "choose a job"), (store, job, got)
        assert got["strategy-summary"]["children"] == ""


def test_host_header_allow_list_and_basic_auth(stores):
    inside, _ = stores
    app = create_app(str(inside))
    install(app.server, "127.0.0.1", 8050, ("ann", "s3cret"))
    c = app.server.test_client()
    good = {"Authorization": "Basic " + base64.b64encode(b"ann:s3cret").decode()}
    assert c.get("/", headers={"Host": "evil.example:8050", **good}).status_code == 403
    assert c.get("/", headers={"Host": "127.0.0.1:8050"}).status_code == 401
    bad = {"Authorization": "Basic " + base64.b64encode(b"ann:wrong").decode()}
    assert c.get("/", headers={"Host": "127.0.0.1:8050", **bad}).status_code == 401
    assert c.get("/", headers={"Host": "localhost:8050", **good}).status_code == 200


def test_non_loopback_bind_needs_auth(stores):
    inside, _ = stores
    assert main(["dashboard", "--store", str(inside), "--host", "0.0.0.0"]) == 2
    assert main(["dashboard", "--store", str(inside), "--auth", "nocolon"]) == 2


def test_errors_are_generic_in_the_page(stores, monkeypatch, caplog):
    from rankscope.dashboard import app as app_mod

    inside, _ = stores

    def boom(*a, **k):
        raise ValueError("secret /etc/shadow detail")

    monkeypatch.setattr(app_mod.JobViews, "get", boom)
    monkeypatch.setattr(app_mod, "_pages", type(app_mod._pages)())  # no page built by an earlier test
    c = app_mod.page_content(app_mod.JobViews(), str(inside), "handjob")["status.children"]
    assert "secret" not in c and "server log" in c
    assert "secret /etc/shadow detail" in caplog.text


def test_a_request_body_over_the_limit_is_refused_unread(stores):
    from rankscope.dashboard.security import MAX_BODY_BYTES

    inside, _ = stores
    app = create_app(str(inside))
    install(app.server, "127.0.0.1", 8050, ("u", "p"))
    c = app.server.test_client()
    auth = {"Host": "127.0.0.1:8050", "Authorization": "Basic " + base64.b64encode(b"u:p").decode()}
    r = c.post("/_dash-update-component", data=b"x" * (MAX_BODY_BYTES + 1), headers=auth,
               content_type="application/json")
    assert r.status_code == 413
    r = c.post("/_dash-update-component", data=b"x" * (MAX_BODY_BYTES + 1), content_type="application/json",
               headers={"Host": "127.0.0.1:8050"})
    assert r.status_code in (401, 413)


def test_the_readme_shows_the_environment_variable_not_a_password_on_the_command_line():
    from pathlib import Path

    readme = (Path(__file__).parents[3] / "README.md").read_text()
    assert "RANKSCOPE_DASHBOARD_AUTH=" in readme and "--auth u" not in readme
