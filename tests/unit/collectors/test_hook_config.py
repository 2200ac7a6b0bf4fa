"""HookConfig: validation, environment round trip, and the job-name rule shared with the store."""

from __future__ import annotations

import pytest

from rankscope.collectors.errors import ConfigError, UsageError
from rankscope.collectors.hooks.hook_config import ROW_COST_BYTES, HookConfig


def test_env_round_trip_and_overrides(tmp_path):
    c = HookConfig(store=str(tmp_path), job="j1", flush_interval_s=0.5, buffer_bytes=1 << 20,
                   hang_timeout_s=12.0, watchdog=False)
    env = c.to_env()
    assert env["RANKSCOPE_HOOK_WATCHDOG"] == "0"
    assert HookConfig.from_env(env) == c
    assert HookConfig.from_env(env, job="other", flush_interval_s=None).job == "other"
    assert c.buffer_rows == (1 << 20) // ROW_COST_BYTES


def test_relative_store_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert HookConfig(store="st").store == str(tmp_path / "st")


@pytest.mark.parametrize("kw", [
    {"flush_interval_s": 0}, {"buffer_bytes": 10}, {"hang_timeout_s": -1}, {"job": "a/b"}, {"job": ""},
    {"store": ""}])
def test_bad_values_raise_config_error(tmp_path, kw):
    with pytest.raises(ConfigError):
        HookConfig(**{"store": str(tmp_path), **kw})


def test_bad_env_value_names_the_variable(tmp_path):
    with pytest.raises(ConfigError, match="RANKSCOPE_HOOK_FLUSH_INTERVAL_S"):
        HookConfig.from_env({"RANKSCOPE_HOOK_STORE": str(tmp_path), "RANKSCOPE_HOOK_FLUSH_INTERVAL_S": "soon"})
    with pytest.raises(ConfigError, match="no store"):
        HookConfig.from_env({})


@pytest.mark.parametrize("name", ["llama", "a.b:c+d-e_f", "x" * 128, "x" * 129, "a b", "a/b", "", "ü"])
def test_job_rule_equals_the_stores(tmp_path, name):
    from rankscope.collectors.store import check_job_name

    try:
        check_job_name(name)
        store_ok = True
    except UsageError:
        store_ok = False
    try:
        HookConfig(store=str(tmp_path), job=name)
        hook_ok = True
    except ConfigError:
        hook_ok = False
    assert hook_ok == store_ok
