"""Config loading: defaults with no file, errors that name the key path, YAML errors with line and column."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatchd.config.loader import (
    DEFAULT_LISTEN,
    DEFAULT_PORT,
    Config,
    ConfigError,
    config_from_dict,
    load_config,
    parse_listen,
)


def _problems(data: object) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        config_from_dict(data, "t.yml")  # type: ignore[arg-type]
    return ei.value.problems


def test_no_file_gives_defaults(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yml"
    cfg = load_config(missing)
    assert cfg == Config(host=cfg.host)
    assert cfg.listen == DEFAULT_LISTEN and parse_listen(cfg.listen) == ("0.0.0.0", DEFAULT_PORT)
    assert cfg.nvml.poll_interval == 1.0
    assert cfg.nvml.library_path is None


def test_host_comes_from_the_environment_when_the_file_has_none(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """$GPUWATCHD_HOST (the DaemonSet's node name) is the default `host`; a file's own `host` wins; a blank value
    falls back to the hostname; a bad one is refused under `host`, naming the variable."""
    import socket

    f = tmp_path / "c.yml"
    f.write_text("listen: 127.0.0.1:9945\n")
    monkeypatch.setenv("GPUWATCHD_HOST", " gpu-node-17 ")
    assert load_config(f).host == "gpu-node-17" and load_config(None).host == "gpu-node-17"
    assert config_from_dict({"host": "from-file"}, "t.yml").host == "from-file"
    monkeypatch.setenv("GPUWATCHD_HOST", "   ")
    assert load_config(f).host == socket.gethostname()
    monkeypatch.setenv("GPUWATCHD_HOST", "node\x1b[2J")
    assert _problems({}) == ["host: $GPUWATCHD_HOST must not contain control characters"]
    assert config_from_dict({"host": "from-file"}, "t.yml").host == "from-file"  # the file's value is not the variable
    monkeypatch.setenv("GPUWATCHD_HOST", "n" * 256)
    assert _problems({}) == ["host: $GPUWATCHD_HOST is longer than 255 characters"]


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(tmp_path / "absent.yml", required=True)
    assert ei.value.problems == ["file not found"]


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    f = tmp_path / "empty.yml"
    f.write_text("# nothing set\n")
    assert load_config(f).nvml.poll_timeout == 5.0


def test_values_are_parsed(tmp_path: Path) -> None:
    f = tmp_path / "c.yml"
    f.write_text(
        "listen: 127.0.0.1:9000\nnvml:\n  poll_interval: 250ms\n  library_path: /opt/nv\nhistory: {retention: 2h}\n"
    )
    cfg = load_config(f)
    assert parse_listen(cfg.listen) == ("127.0.0.1", 9000)
    assert cfg.nvml.poll_interval == 0.25
    assert cfg.nvml.library_path == Path("/opt/nv")
    assert cfg.history.retention == 7200.0


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"nvml": {"poll_interval": "fast"}}, "nvml.poll_interval: expected a duration"),
        ({"nvml": {"poll_interval": -1}}, "nvml.poll_interval: duration must not be negative"),
        ({"processes": {"top_n": -3}}, "processes.top_n: "),
        ({"processes": {"top_n": "many"}}, "processes.top_n: "),
        ({"listen": "localhost"}, "listen: expected HOST:PORT"),
        ({"listen": "localhost:99999"}, "listen: expected HOST:PORT"),
        ({"history": {"step": [1]}}, "history.step: "),
        ({"nvml": "yes"}, "nvml: "),
    ],
)
def test_bad_values_name_their_key_path(data: dict[str, object], expected: str) -> None:
    problems = _problems(data)
    assert len(problems) == 1, problems
    assert problems[0].startswith(expected), problems


def test_unknown_keys_are_errors() -> None:
    problems = _problems({"nvml": {"poll_intervall": 1}, "lisen": ":1"})
    assert sorted(problems) == [
        "lisen: Extra inputs are not permitted",
        "nvml.poll_intervall: Extra inputs are not permitted",
    ]


def test_every_problem_is_reported_at_once() -> None:
    problems = _problems({"nvml": {"poll_interval": "x", "poll_timeout": "y"}, "processes": {"top_n": -1}})
    assert {p.split(":")[0] for p in problems} == {"nvml.poll_interval", "nvml.poll_timeout", "processes.top_n"}


def test_top_level_must_be_a_mapping() -> None:
    assert _problems(["listen"]) == ["(top level): expected a mapping of settings"]


def test_bad_yaml_reports_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "bad.yml"
    f.write_text("nvml:\n  poll_interval: 1s\n  poll_timeout: [5s\n")
    with pytest.raises(ConfigError) as ei:
        load_config(f)
    (problem,) = ei.value.problems
    assert problem.startswith("line 4, column 1: invalid YAML"), problem
    assert str(ei.value).startswith(f"{f}: line 4")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(tmp_path)  # a directory
    assert ei.value.problems[0].startswith("cannot read")


def test_config_is_frozen() -> None:
    cfg = Config()
    with pytest.raises(AttributeError, match="immutable"):
        cfg.nvml.poll_interval = 2.0  # type: ignore[misc]


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwatchd", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_check_config_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "good.yml"
    good.write_text("nvml:\n  poll_interval: 2s\n")
    res = _check(good)
    assert (res.returncode, res.stdout.strip()) == (0, f"{good}: OK")

    bad = tmp_path / "bad.yml"
    bad.write_text("nvml:\n  poll_interval: soon\nprocesses:\n  top_n: -1\n")
    res = _check(bad)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert [line.split(": ")[1] for line in lines] == ["nvml.poll_interval", "processes.top_n"], res.stderr

    res = _check(tmp_path / "absent.yml")
    assert res.returncode == 2
    assert "absent.yml: file not found" in res.stderr


def test_shipped_example_config_is_valid() -> None:
    example = Path(__file__).resolve().parents[1] / "docs" / "gpuwatchd.example.yml"
    cfg = load_config(example, required=True)
    assert cfg.nvml.poll_interval == Config().nvml.poll_interval  # the example documents the defaults


def test_configuration_reference_is_up_to_date() -> None:
    from gpuwatchd.config.doc import DOC_PATH, render_reference, splice

    current = DOC_PATH.read_text(encoding="utf-8")
    assert current == splice(current, render_reference()), (
        "docs/configuration.md is out of date: run `python -m gpuwatchd.config.doc --write`"
    )


def test_configuration_reference_lists_every_key() -> None:
    from gpuwatchd.config.doc import render_reference

    doc = render_reference()
    for key in ("`listen`", "`nvml.poll_interval`", "`nvml.library_path`", "`processes.top_n`", "`history.step`"):
        assert key in doc
    for name in Config.__struct_fields__:
        assert f"`{name}`" in doc or f"### `{name}`" in doc, name
