"""The launcher variables read as torch reads them (jobenv.launcher), on literal environments: which
launcher, which integers, which values int() rejects, what is missing. Judging is launcher_env's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.jobenv.launcher import (
    ENV_RENDEZVOUS_VARS,
    TORCHRUN_VARS,
    Launcher,
    detect,
    env_int,
    parse,
    read_int,
    slurm_job_gpus,
)

TORCHRUN = {"TORCHELASTIC_RUN_ID": "j", "RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8",
            "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
            "ROLE_RANK": "6", "ROLE_WORLD_SIZE": "8", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(("env", "launchers"), [
    ({}, ()),
    ({"PATH": "/bin"}, ()),
    ({"LOCAL_RANK": "0"}, (Launcher.ENV,)),
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0"}, (Launcher.TORCHRUN,)),
    ({"SLURM_JOB_ID": "1"}, (Launcher.SLURM,)),
    ({"SLURM_JOBID": "1", "RANK": "0"}, (Launcher.ENV, Launcher.SLURM)),
])
def test_detect(env: dict[str, str], launchers: tuple[Launcher, ...]) -> None:
    assert detect(env) == launchers


def test_complete_torchrun_reads_every_integer() -> None:
    found = parse(TORCHRUN)
    assert found.launchers == (Launcher.TORCHRUN,)
    assert found.required == TORCHRUN_VARS and found.missing == ()
    assert found.ints["RANK"] == 6 and found.ints["GROUP_WORLD_SIZE"] == 2
    assert "MASTER_PORT" not in found.ints  # master_port reads that one
    assert found.not_integers == ()


def test_env_launch_needs_only_the_rendezvous_variables() -> None:
    found = parse({"RANK": "0", "LOCAL_RANK": "0"})
    assert found.required == ENV_RENDEZVOUS_VARS
    assert found.missing == ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_an_empty_required_variable_is_missing_not_a_bad_integer() -> None:
    found = parse({**TORCHRUN, "RANK": ""})
    assert found.missing == ("RANK",) and found.not_integers == ()


def test_values_int_rejects_are_listed_in_reading_order() -> None:
    found = parse({**TORCHRUN, "WORLD_SIZE": "eight", "RANK": "0x6"})
    assert found.not_integers == (("RANK", "0x6"), ("WORLD_SIZE", "eight"))


def test_slurm_variables_are_read_only_in_a_slurm_job() -> None:
    assert "SLURM_NTASKS" not in parse({"RANK": "0", "SLURM_NTASKS": "3"}).ints
    found = parse({"SLURM_JOB_ID": "42", "SLURM_PROCID": "3", "SLURM_NTASKS": "x"})
    assert found.ints == {"SLURM_JOB_ID": 42, "SLURM_PROCID": 3}
    assert found.not_integers == (("SLURM_NTASKS", "x"),) and found.required == ()


def test_prolog_context() -> None:
    found = parse({"SLURM_JOB_ID": "42", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"})
    assert found.in_prolog and found.slurm_context == "prolog_slurmd"
    assert not parse({"SLURM_JOB_ID": "42", "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}).in_prolog


@pytest.mark.parametrize(("raw", "value"), [
    (" 7 ", 7), ("1_0", 10), ("+3", 3), ("-1", -1), ("٣", 3),
    ("", None), (None, None), ("0x10", None), ("1e3", None), ("seven", None),
])
def test_read_int_is_pythons_int(raw: str | None, value: int | None) -> None:
    assert read_int(raw) == value


def test_env_int() -> None:
    assert env_int({"LOCAL_WORLD_SIZE": "4"}, "LOCAL_WORLD_SIZE") == 4
    assert env_int({}, "LOCAL_WORLD_SIZE") is None


@pytest.mark.parametrize(("raw", "gpus"), [
    ("0,1,2,3", [0, 1, 2, 3]), ("5", [5]), ("1,,2", [1, 2]), ("", None), ("0,a", None),
])
def test_slurm_job_gpus(raw: str, gpus: list[int] | None) -> None:
    assert slurm_job_gpus({"SLURM_JOB_GPUS": raw}) == gpus
    assert slurm_job_gpus({}) is None


VARS = (*TORCHRUN_VARS, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS",
        "SLURM_STEP_ID", "SLURM_SCRIPT_CONTEXT")
values = st.one_of(st.text(max_size=12), st.integers(-5, 70000).map(str),
                   st.sampled_from(["", " 1", "1_0", "٣", "+2", "0x10", "1e3"]))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(VARS), values, max_size=len(VARS)))
def test_every_variable_is_an_integer_bad_missing_or_not_read(env: dict[str, str]) -> None:
    found = parse(env)
    bad = dict(found.not_integers)
    assert not set(bad) & set(found.ints)
    for name, value in found.ints.items():
        assert value == int(env[name])  # the integer torch would read
    for raw in bad.values():
        with pytest.raises(ValueError):
            int(raw)
    assert set(found.missing) <= set(found.required)
    assert all(not env.get(n) for n in found.missing)
