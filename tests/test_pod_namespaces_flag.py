"""``--pod-namespaces`` (``KEDA_GPU_SCALER_POD_NAMESPACES``): its default, how a value is
written back, and usage errors naming the flag, the value and the variable."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.app.cli import build_parser


def test_the_flag_defaults_to_triggers_and_is_normalized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert build_parser().parse_args(["serve"]).pod_namespaces == "triggers"
    args = build_parser().parse_args(["serve", "--pod-namespaces", "serving, ml"])
    assert args.pod_namespaces == "ml,serving"
    monkeypatch.setenv("KEDA_GPU_SCALER_POD_NAMESPACES", "all")
    assert build_parser().parse_args(["serve"]).pod_namespaces == "all"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ml,Bad", "argument --pod-namespaces: 'Bad' is not a namespace name"),
        ("", "argument --pod-namespaces: '': give triggers, all, or namespaces"),
        ("all,ml", "argument --pod-namespaces: 'all,ml': all stands alone"),
    ],
)
def test_a_bad_flag_value_is_a_usage_error_naming_the_flag_and_value(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--pod-namespaces", value])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_variable_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KEDA_GPU_SCALER_POD_NAMESPACES", "every")
    build_parser().parse_args(["serve"])  # "every" is a namespace name: a list of one
    monkeypatch.setenv("KEDA_GPU_SCALER_POD_NAMESPACES", "Every")
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --pod-namespaces: 'Every' is not a namespace name" in err
    assert "(from KEDA_GPU_SCALER_POD_NAMESPACES)" in err
