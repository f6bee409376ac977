"""The playground route: on when asked, absent otherwise, and told only what the server was
started with."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from dllm_decode.viz.playground import is_local, playground_page


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _config(page: str) -> dict:
    found = re.search(r'<script id="server-config" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def test_the_page_is_served_only_when_on(embedded):
    pytest.importorskip("fastapi")
    from dllm_decode.serve.app import background
    from tests.serve.conftest import make_state

    on = make_state(embedded)
    on.playground = True
    with background(on) as url:
        status, page = _get(url + "/")
        assert status == 200 and "dllm-decode playground" in page
        config = _config(page)
        assert config["model"] == "embedded" and config["config"] == on.settings.config.to_dict()
        assert config["max_tokens"] == 256 and "threshold" in config["schedulers"]
        assert config["provisional"] is True                      # the protocol has dllm.stream_mode
        assert config["end_of_text"] == [embedded.tokenizer.eos_token]  # drawn as one mark
        assert "openapi" not in page and "/v1/completions" in page       # the public API only
    off = make_state(embedded)
    with background(off) as url:
        status, body = _get(url + "/")
        assert status == 404 and "no route /" in body


def test_settings_are_escaped_in_the_page():
    from dllm_decode.serve.protocol import Settings
    from tests.serve.conftest import default_config

    page = playground_page(Settings(model_id="</script><b>x", config=default_config()))
    assert page.count("</script>") == 2 and _config(page)["model"] == "</script><b>x"


@pytest.mark.parametrize("host, local", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                         ("127.0.1.1", True), ("0.0.0.0", False), ("10.0.0.5", False)])
def test_on_by_default_for_loopback_hosts_only(host, local):
    assert is_local(host) is local


def test_serve_has_the_flag():
    from click.testing import CliRunner

    from dllm_decode.cli import main

    out = CliRunner().invoke(main, ["serve", "--help"])
    assert "--playground / --no-playground" in out.output
