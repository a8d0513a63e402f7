from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preflight.core.config import Config, ConfigError, from_env, load, load_file


def test_defaults_are_valid() -> None:
    cfg = load(path=None, env={}, overrides={})
    assert cfg == Config()


def test_toml_and_yaml_files(tmp_path: Path) -> None:
    toml = tmp_path / "p.toml"
    toml.write_text('expect_gpus = 8\nwatched_packages = ["torch", "numpy"]\n')
    assert load_file(toml).expect_gpus == 8
    assert load_file(toml).watched_packages == ("torch", "numpy")
    yml = tmp_path / "p.yaml"
    yml.write_text("preflight:\n  expect_gpus: 4\n  shm_min_bytes: 2147483648\n")
    cfg = load_file(yml)
    assert (cfg.expect_gpus, cfg.shm_min_bytes) == (4, 2 << 30)


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("expect_gpu: 8\n")
    with pytest.raises(ConfigError) as err:
        load_file(f)
    assert "expect_gpu" in str(err.value) and str(f) in str(err.value)


def test_wrong_type_names_key_and_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text('expect_gpus = "eight"\n')
    with pytest.raises(ConfigError) as err:
        load_file(f)
    assert "expect_gpus" in str(err.value) and "integer" in str(err.value)
    assert str(f) in str(err.value)


def test_bool_is_not_an_integer(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("expect_gpus: true\n")
    with pytest.raises(ConfigError, match="expect_gpus"):
        load_file(f)


def test_precedence_file_env_cli(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("expect_gpus: 8\ncheck_timeout_s: 5\nmulti_node: true\n")
    env = {"PREFLIGHT_EXPECT_GPUS": "4", "PREFLIGHT_MULTI_NODE": "no"}
    cfg = load(path=str(f), env=env, overrides={"check_timeout_s": 2.5, "expect_gpus": None})
    assert cfg.expect_gpus == 4  # env beats file; None from the CLI means "not given"
    assert cfg.multi_node is False
    assert cfg.check_timeout_s == 2.5  # CLI beats file


def test_preflight_config_env_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text("[preflight]\nexpect_gpus = 2\n")
    assert load(path=None, env={"PREFLIGHT_CONFIG": str(f)}, overrides={}).expect_gpus == 2


def test_range_errors() -> None:
    with pytest.raises(ConfigError, match="check_timeout_s"):
        load(path=None, env={"PREFLIGHT_CHECK_TIMEOUT_S": "0"}, overrides={})
    with pytest.raises(ConfigError, match="listen"):
        load(path=None, env={"PREFLIGHT_LISTEN": "nowhere"}, overrides={})


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_file(tmp_path / "missing.toml")
    bad = tmp_path / "x.toml"
    bad.write_text("expect_gpus = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_file(bad)
    top = tmp_path / "x.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_file(top)


_KEYS = st.sampled_from(["EXPECT_GPUS", "CHECK_TIMEOUT_S", "MULTI_NODE", "WATCHED_PACKAGES",
                         "GOLDEN", "MIN_BUSBW_GBPS", "LISTEN", "NOT_A_KEY"])


@given(key=_KEYS, value=st.text(max_size=30))
def test_any_env_value_is_accepted_or_a_config_error(key: str, value: str) -> None:
    try:
        from_env({f"PREFLIGHT_{key}": value}, base=Config())
    except ConfigError as exc:
        assert key.lower() in str(exc)
