from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from preflight.core.config import (
    Config,
    ConfigError,
    SiteCheck,
    as_data,
    from_env,
    load,
    load_file,
)


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


# -- site_checks: a list of tables --------------------------------------------------------------

SITE_TOML = """
[[site_checks]]
name = "lustre"
path = "/usr/local/libexec/preflight/lustre"
args = ["--fs", "/lustre"]
timeout_s = 5

[[site_checks]]
name = "licence"
path = "/opt/site/licence-ok"
scope = "job"
reason = "LicenceDown"
"""
SITE_YAML = """
site_checks:
  - name: lustre
    path: /usr/local/libexec/preflight/lustre
    args: [--fs, /lustre]
    timeout_s: 5
  - {name: licence, path: /opt/site/licence-ok, scope: job, reason: LicenceDown}
"""


def test_site_checks_read_alike_from_toml_and_yaml(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(SITE_TOML)
    (tmp_path / "s.yaml").write_text(SITE_YAML)
    toml, yml = load_file(tmp_path / "s.toml"), load_file(tmp_path / "s.yaml")
    assert toml == yml
    assert toml.site_checks == (
        SiteCheck("lustre", "/usr/local/libexec/preflight/lustre", ("--fs", "/lustre"), 5.0),
        SiteCheck("licence", "/opt/site/licence-ok", scope="job", reason="LicenceDown"))


def test_site_checks_travel_to_the_daemons_child_unchanged(tmp_path: Path) -> None:
    """The daemon hands its config to the check child as YAML (as_data)."""
    (tmp_path / "s.toml").write_text(SITE_TOML)
    cfg = load_file(tmp_path / "s.toml")
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(as_data(cfg)))
    assert load_file(again) == cfg


@pytest.mark.parametrize(("entry", "message"), [
    ("site_checks: lustre", "site_checks must be a list of tables (name, path, ...)"),
    ("site_checks: [5]", "site_checks[0] must be a table with name, path"),
    ("site_checks: [{name: a}]", "site_checks[0]: missing path"),
    ("site_checks: [{name: a, path: /x, time: 3}]", "site_checks[0]: unknown key 'time'"),
    ("site_checks: [{name: a, path: /x, timeout_s: soon}]",
     "site_checks[0].timeout_s must be a number"),
    ("site_checks: [{name: a, path: /x, timeout_s: 0}]",
     "site_checks[0].timeout_s must be a finite number in 0.001..600 s"),
    ("site_checks: [{name: a, path: /x, args: [1]}]",
     "site_checks[0].args must be a list of strings"),
    ("site_checks: [{name: a, path: x}]", "site_checks[0].path must be an absolute path"),
    ("site_checks: [{name: Lustre, path: /x}]", "site_checks[0].name must be lower-case"),
    ("site_checks: [{name: a, path: /x, scope: undecided}]",
     "site_checks[0].scope must be node or job"),
    ("site_checks: [{name: a, path: /x, reason: not-camel}]",
     "site_checks[0].reason must be a CamelCase token"),
    ("site_checks: [{name: a, path: /x}, {name: a, path: /y}]",
     "site_checks[1].name must be a name no other site check has"),
])
def test_site_check_errors_name_the_entry_and_key(tmp_path: Path, entry: str,
                                                  message: str) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(entry + "\n")
    with pytest.raises(ConfigError) as err:
        load_file(f)
    assert str(err.value).startswith(f"{f}: {message}")


def test_site_checks_are_bounded(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("site_checks:\n" + "".join(f"  - {{name: c{i}, path: /x}}\n"
                                            for i in range(65)))
    with pytest.raises(ConfigError, match="site_checks has 65 entries, at most 64"):
        load_file(f)


def test_site_checks_cannot_come_from_the_environment() -> None:
    with pytest.raises(ConfigError, match="site_checks is a list of tables: set it in the "
                                          "config file"):
        from_env({"PREFLIGHT_SITE_CHECKS": "/bin/true"}, base=Config())


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(),
                     st.text(max_size=12), st.sampled_from(["/bin/true", "node", "job", "x"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
_TABLE = st.dictionaries(st.sampled_from(["name", "path", "args", "timeout_s", "scope", "reason",
                                          "remedy", "summary", "other"]), _VALUES, max_size=8)


@given(st.one_of(_VALUES, st.lists(_TABLE, max_size=4)))
def test_any_site_checks_value_is_accepted_or_a_config_error(value: object) -> None:
    from preflight.core.config import from_mapping

    try:
        cfg = from_mapping({"site_checks": value}, source="f.yaml")
    except ConfigError as exc:
        assert str(exc).startswith("f.yaml: site_checks")
    else:
        assert all(sc.path.startswith("/") for sc in cfg.site_checks)
