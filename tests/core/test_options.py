"""The shared shape of a job's options: one frozen object, validated once, old keywords warned."""

import warnings
from typing import ClassVar

import pytest
from pydantic import ValidationError

from dpone_dagster.core.errors import EngineError
from dpone_dagster.core.options import JobOptions, build_options


class _Options(JobOptions):
    refusal: ClassVar[str] = "kafka_options_invalid"
    batch: int = 10
    name: str = "x"


def test_an_invalid_option_is_the_jobs_coded_error_naming_the_field() -> None:
    with pytest.raises(EngineError) as caught:
        _Options.parse({"batch": "many"})
    assert caught.value.code == "kafka_options_invalid"
    assert "batch" in str(caught.value)


def test_options_are_frozen_and_refuse_unknown_fields() -> None:
    options = _Options(batch=3)
    with pytest.raises(ValidationError):
        options.batch = 4  # type: ignore[misc]
    with pytest.raises(EngineError, match="colour"):
        _Options.parse({"colour": "red"})


def test_shortcuts_override_the_object_and_are_validated() -> None:
    built = build_options(
        _Options, _Options(batch=3), caller="f", shortcuts={"name": "y", "batch": None}
    )
    assert (built.batch, built.name) == (3, "y")
    with pytest.raises(EngineError):
        build_options(_Options, None, caller="f", shortcuts={"batch": "many"})


def test_old_keyword_arguments_still_work_with_a_deprecation_warning_naming_them() -> None:
    with pytest.warns(DeprecationWarning, match=r"f\(\.\.\., batch=\.\.\.\).*options=_Options"):
        built = build_options(_Options, None, caller="f", legacy={"batch": 7})
    assert built.batch == 7
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build_options(_Options, None, caller="f") == _Options()


def test_an_unknown_keyword_argument_is_a_type_error_as_in_any_python_call() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        build_options(_Options, None, caller="f", legacy={"colour": "red"})
    with pytest.raises(TypeError, match="takes a _Options"):
        build_options(_Options, {"batch": 1}, caller="f")  # type: ignore[arg-type]
