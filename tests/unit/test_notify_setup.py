"""The notification setup in docs/REAL_NODE.md (linked from the README) and .env.example works when pasted.

Each ``airflow connections add rl_verify_notify`` line of that page and the ``AIRFLOW_CONN_RL_VERIFY_NOTIFY``
of .env.example, with its ``<...>`` placeholders filled in, is read by the Apprise provider's own hook
into Apprise services of the chat it names (nothing is sent). The ``[api] base_url`` note says what
``links.absolute`` does.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from rl_verify import settings

from rl_verify.orchestration import links

REPO = Path(__file__).resolve().parents[2]
#: Where the README sends a person setting up notifications.
README = (REPO / "docs" / "REAL_NODE.md").read_text()
ENV_EXAMPLE = (REPO / ".env.example").read_text()
#: What Apprise must make of each documented scheme.
PLUGINS = {"feishu": "NotifyFeishu", "lark": "NotifyLark", "dingtalk": "NotifyDingTalk", "slack": "NotifySlack"}


def fill(text: str) -> str:
    """Placeholders (``<token>``, ``<T...>``...) as a token of the shape the bots hand out."""
    return re.sub(r"<[^<>\s\"]+>", "0a1b2c3d4e5f", text)


def readme_commands() -> list[list[str]]:
    """Every `airflow connections add rl_verify_notify` command of the README, as shell words."""
    joined = README.replace("\\\n", " ")
    return [shlex.split(line.strip()) for line in joined.splitlines()
            if line.strip().startswith(f"airflow connections add {settings.NOTIFY_CONN_ID} ")]


def entries(extra: dict) -> list[dict]:
    """The connection's Apprise entries: one ``{"path": ...}`` or a list of them."""
    return extra["config"] if isinstance(extra["config"], list) else [extra["config"]]


def services(extra: dict) -> list[str]:
    """The Apprise services the provider's hook builds from a connection with this extra."""
    import apprise
    from airflow.providers.apprise.hooks.apprise import AppriseHook
    from airflow.sdk import Connection

    conn = Connection(conn_id=settings.NOTIFY_CONN_ID, conn_type="apprise", extra=fill(json.dumps(extra)))
    target = apprise.Apprise()
    AppriseHook(settings.NOTIFY_CONN_ID).set_config_from_conn(conn, target)
    assert len(target) == len(entries(extra)), f"Apprise could not read every entry of {extra}"
    return [type(service).__name__ for service in target]


def expected(extra: dict) -> list[str]:
    return [PLUGINS[entry["path"].split("://")[0]] for entry in entries(extra)]


def test_the_readme_has_a_pasteable_command_per_chat():
    commands = readme_commands()
    schemes = {entry["path"].split("://")[0] for words in commands
               for entry in entries(json.loads(words[words.index("--conn-extra") + 1]))}
    assert {"feishu", "lark", "slack", "dingtalk"} <= schemes, schemes


@pytest.mark.parametrize("words", readme_commands(), ids=lambda w: w[-1][:60])
def test_each_readme_command_gives_the_chat_it_names(words):
    assert words[:4] == ["airflow", "connections", "add", settings.NOTIFY_CONN_ID]
    options = dict(zip(words[4::2], words[5::2]))
    assert set(options) == {"--conn-type", "--conn-extra"} and options["--conn-type"] == "apprise", words
    extra = json.loads(options["--conn-extra"])
    assert services(extra) == expected(extra)


def test_env_example_has_the_connection_and_the_base_url():
    from airflow.sdk import Connection

    value = re.search(r"^AIRFLOW_CONN_RL_VERIFY_NOTIFY='(.+)'$", ENV_EXAMPLE, re.M)
    assert value, "AIRFLOW_CONN_RL_VERIFY_NOTIFY missing from .env.example"
    conn = Connection.from_json(value.group(1), conn_id=settings.NOTIFY_CONN_ID)
    assert conn.conn_type == "apprise"
    assert services(conn.extra_dejson) == expected(conn.extra_dejson) == ["NotifyFeishu", "NotifySlack"]
    assert re.search(r"^AIRFLOW__API__BASE_URL=https://\S+$", ENV_EXAMPLE, re.M)


def test_links_are_bare_paths_without_base_url_as_the_readme_says():
    path = links.report_view_path(settings.DAG_ID, "manual__1")
    assert links.absolute(None, path) == path and path.startswith("/dags/rl_accuracy_verification/runs/")
    assert links.absolute("https://airflow.example.internal/", path) == "https://airflow.example.internal" + path
    assert "AIRFLOW__API__BASE_URL" in README and "`[api] base_url`" in README


def test_the_readme_url_check_command_exists():
    assert "`apprise -t " in README and "`.venv/bin/apprise`" in README
    assert (Path(sys.executable).parent / "apprise").exists(), "apprise's CLI is not in the virtualenv"
