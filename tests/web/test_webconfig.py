"""The web config file (exporter-toolkit format): what it accepts, and one ``key.path: message`` per problem."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from tls_files import TlsFiles, make_tls_files

from gpuwatchd.cli.commands import main
from gpuwatchd.web.webconfig import WebConfigError, load_web_config

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def write(tmp_path: Path, doc: Any, name: str = "web.yml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_full_file_loads(tmp_path: Path, tls_files: TlsFiles) -> None:
    path = write(
        tmp_path,
        {
            "tls_server_config": {
                "cert_file": str(tls_files.cert),
                "key_file": str(tls_files.key),
                "client_auth_type": "RequireAndVerifyClientCert",
                "client_ca_file": str(tls_files.cert),
                "min_version": "TLS13",
            },
            "basic_auth_users": {"prometheus": HASH},
        },
    )
    cfg = load_web_config(path)
    assert cfg.basic_auth_users == {"prometheus": HASH}
    ctx = cfg.ssl_context()
    assert ctx is not None
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
    assert ctx.verify_mode == ssl.CERT_REQUIRED


def test_auth_only_and_empty_files_mean_plain_http(tmp_path: Path) -> None:
    assert load_web_config(write(tmp_path, {"basic_auth_users": {"a": HASH}})).ssl_context() is None
    empty = tmp_path / "empty.yml"
    empty.write_text("")
    cfg = load_web_config(empty)
    assert cfg.ssl_context() is None and cfg.basic_auth_users == {}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"tls_server_config": {"cert_file": "/nonexistent/x.crt", "key_file": "KEY"}},
         "tls_server_config.cert_file: /nonexistent/x.crt: file not found"),
        ({"tls_server_config": {"cert_file": "CERT"}}, "tls_server_config.key_file: Field required"),
        ({"basic_auth_users": {"alice": "hunter2"}}, "basic_auth_users: user 'alice': not a bcrypt hash"),
        ({"basic_auth_users": {"alice": "$2y$10$" + "!" * 53}}, "basic_auth_users: user 'alice': not a bcrypt hash"),
        ({"basic_auth_users": {"alice": "$2y$1x$" + "a" * 53}}, "basic_auth_users: user 'alice': not a bcrypt hash"),
        ({"basic_auth_users": {"alice": "$2y$31$" + "a" * 53}},
         "basic_auth_users: user 'alice': bcrypt cost 31 is outside 4..12"),
        ({"basic_auth_users": {"alice": "$2y$99$" + "a" * 53}},
         "basic_auth_users: user 'alice': bcrypt cost 99 is outside 4..12"),
        ({"basic_auth_users": {"alice": "$2y$17$" + "a" * 53}},
         "basic_auth_users: user 'alice': bcrypt cost 17 is outside 4..12"),
        ({"basic_auth_users": {"alice": "$2y$03$" + "a" * 53}},
         "basic_auth_users: user 'alice': bcrypt cost 3 is outside 4..12"),
        ({"basic_users": {}}, "basic_users: Extra inputs are not permitted"),
        ({"tls_server_config": {"cert_file": "CERT", "key_file": "KEY", "cipher_suites": ["X"]}},
         "tls_server_config.cipher_suites: Extra inputs are not permitted"),
        ({"tls_server_config": {"cert_file": "CERT", "key_file": "KEY", "client_auth_type": "RequireAnyClientCert"}},
         "tls_server_config.client_auth_type: Input should be 'NoClientCert'"),
        ({"tls_server_config": {"cert_file": "CERT", "key_file": "KEY", "client_auth_type": "VerifyClientCertIfGiven"}},
         "tls_server_config: client_auth_type VerifyClientCertIfGiven needs client_ca_file"),
        ({"tls_server_config": {"cert_file": "CERT", "key_file": "KEY", "min_version": "TLS13",
                                "max_version": "TLS12"}},
         "tls_server_config: min_version must not be above max_version"),
        ({"tls_server_config": {"cert_file": "CERT", "key_file": "OTHER"}},
         "tls_server_config.cert_file: cannot load certificate and key"),
        (["a"], "(top level): expected a mapping"),
    ],
)
def test_check_config_names_the_key(
    tmp_path: Path, tls_files: TlsFiles, capsys: pytest.CaptureFixture[str], doc: Any, message: str
) -> None:
    other = make_tls_files(tmp_path, "other")
    text = yaml.safe_dump(doc).replace("CERT", str(tls_files.cert)).replace("OTHER", str(other.key))
    web = tmp_path / "web.yml"
    web.write_text(text.replace("KEY", str(tls_files.key)))
    with pytest.raises(WebConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        load_web_config(web)
    # Through the daemon's config file and check-config: one line, the config key then the web config's key path.
    cfg = write(tmp_path, {"web_config_file": str(web)}, "gpuwatchd.yml")
    assert main(["check-config", str(cfg)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"{cfg}: web_config_file: {web}: {message}")


def test_web_config_flag_refuses_a_bad_file_before_starting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    web = write(tmp_path, {"basic_auth_users": {"alice": "plain"}})
    assert main(["sim", "--web.config.file", str(web), "--listen", "127.0.0.1:0"]) == 1
    err = capsys.readouterr().err
    assert f"--web.config.file {web}: basic_auth_users: user 'alice': not a bcrypt hash" in err
    cfg = write(tmp_path, {}, "c.yml")
    assert main(["run", "--web.config.file", str(tmp_path / "none.yml"), "--config", str(cfg)]) == 2
    assert f"--web.config.file {tmp_path / 'none.yml'}: file not found" in capsys.readouterr().err
