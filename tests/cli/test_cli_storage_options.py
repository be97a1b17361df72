"""``--storage-option KEY=VALUE``: the commands read a run on S3 with the options given to them.

moto's S3 server in this process holds the run; its endpoint and dummy credentials reach the
command as ``--storage-option`` items only, never from fsspec's configuration or the
environment.
"""

import json
import os
import re

import pytest
from cli_runs import field, normalised, rows_of, tiny_model, train

import layerscope
from layerscope.cli import build_parser
from layerscope.cli._storage_options import storage_options
from layerscope.store import ParquetStore

pytest.importorskip("duckdb")  # the commands query runs with DuckDB
pytest.importorskip("pyarrow")

# The commands that read runs through load or runs; demo writes its own, serve a local folder.
READERS = ("summary", "diff", "runs", "plot", "report", "export")


@pytest.fixture
def no_fsspec_configuration(monkeypatch):
    """No S3 options but the command's: none in fsspec's configuration or the environment."""
    import fsspec

    monkeypatch.setattr(fsspec.config, "conf", {})
    for name in [name for name in os.environ if name.startswith("FSSPEC_")]:
        monkeypatch.delenv(name)


def _items(options):
    """``options`` as the command's ``--storage-option KEY=VALUE`` items, dicts as JSON."""
    items = []
    for key, value in options.items():
        text = value if isinstance(value, str) else json.dumps(value)
        items += ["--storage-option", f"{key}={text}"]
    return items


@pytest.fixture
def s3_run(s3, tmp_path):
    """The same training recorded on S3 and on disk: (url of the S3 run, local run)."""
    bucket = s3.new_bucket()
    url = f"s3://{bucket}/runs/exp1"
    train(tiny_model(), ParquetStore(url, flush_steps=1, storage_options=s3.options))
    return url, train(tiny_model(), tmp_path / "runs" / "exp1")


def test_summary_of_a_run_on_s3_reads_it_with_the_options_given(
    s3, s3_run, cli, tmp_path, no_fsspec_configuration
):
    url, local = s3_run
    status, out, err = cli("summary", url, "--plain", *_items(s3.options))
    assert (status, err) == (0, "")
    assert field(out, "path") == url
    assert field(out, "steps") == "3"
    # The values are the run's: those of the library reading it, and of the same training
    # recorded on disk, line for line.
    stats = layerscope.load(url, storage_options=s3.options).stats
    absmax = stats.query("module == '0' and kind == 'activation' and step == 2").absmax
    assert rows_of(out, "layers")[0][3].startswith(f"{absmax.item():.4g} x")
    _, on_disk, _ = cli("summary", local, "--plain")
    assert normalised(out.replace(url, str(local)), tmp_path) == normalised(on_disk, tmp_path)


def test_the_options_go_before_the_command_too_and_to_every_run_it_reads(
    s3, s3_run, cli, no_fsspec_configuration
):
    url, local = s3_run
    status, out, err = cli(*_items(s3.options), "diff", url, local, "--plain", "--top", "0")
    assert (status, err) == (0, "")
    rows = rows_of(out, "layers")
    assert len(rows) > 10
    assert {row[6] for row in rows} == {"0%"}  # the same training, read from S3 and disk

    status, out, err = cli(*_items(s3.options), "--plain", "runs", url.rsplit("/", 1)[0])
    assert (status, err) == (0, "")
    assert re.search(r"^exp1 +finished +3 +1 ", out, re.MULTILINE)


def test_every_command_that_reads_runs_takes_the_option():
    commands = build_parser()._subparsers._group_actions[0].choices
    for name, parser in commands.items():
        options = {flag for action in parser._actions for flag in action.option_strings}
        assert ("--storage-option" in options) == (name in READERS), name


@pytest.mark.parametrize("item", ["anon", "=true", "two words=1", "client_kwargs"])
@pytest.mark.parametrize("before", [False, True])
def test_a_malformed_item_is_a_usage_error_naming_the_option(run_dir, cli, item, before):
    argv = ["summary", run_dir]
    argv = ["--storage-option", item, *argv] if before else [*argv, "--storage-option", item]
    status, out, err = cli(*argv)
    assert (status, out) == (2, "")
    assert err.startswith("usage: layerscope summary")
    assert err.splitlines()[-1] == (
        "layerscope summary: error: argument --storage-option: expected KEY=VALUE, KEY an "
        f"option's name such as anon or client_kwargs and VALUE JSON or text, got {item!r}"
    )


def test_a_value_is_json_where_it_parses_and_text_elsewhere():
    parser = build_parser()
    items = [
        "anon=true",
        "key=AKIA 1",
        'client_kwargs={"endpoint_url": "http://h:9"}',
        "anon=false",
    ]
    args = parser.parse_args(
        ["runs", *[arg for item in items for arg in ("--storage-option", item)]]
    )
    assert storage_options(args) == {
        "anon": False,  # the last of a key
        "key": "AKIA 1",
        "client_kwargs": {"endpoint_url": "http://h:9"},
    }


def test_a_store_that_refuses_the_reader_is_one_line_naming_the_run(
    s3, s3_run, cli, tmp_path, monkeypatch, no_fsspec_configuration
):
    url, _ = s3_run
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    endpoint = {"client_kwargs": s3.options["client_kwargs"]}  # no key, no secret
    status, out, err = cli("summary", url, "--plain", *_items(endpoint))
    assert status == 2
    assert out == ""
    assert err.startswith(f"layerscope summary: {url}: NoCredentialsError: ")
    assert len(err.strip().splitlines()) == 1
