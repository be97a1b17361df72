"""Bad arguments end in one line naming the argument and exit status 2, never a traceback."""

import socket

import pytest

from layerscope.cli import build_parser


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["plot", "{run}", "--modules", "("], "argument --modules: invalid regex '('"),
        (["summary", "{run}", "--alerts", "-3"], "argument --alerts: expected an integer >= 0"),
        (["diff", "{run}", "{run}", "--top", "-1"], "argument --top: expected an integer >= 0"),
        (["summary", "{run}", "--phase", "foo"], "argument --phase: invalid choice: 'foo'"),
        (["diff", "{run}", "{run}", "--phase", "foo"], "argument --phase: invalid choice"),
        (["report", "{run}", "-o", "{tmp}/missing/r.html"], "argument -o/--output: no folder"),
        (["report", "{run}", "-o", "{tmp}"], "is a folder: give a file name"),
        (["serve", "{tmp}", "--plain"], "unrecognized arguments: --plain"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it(cli, run_dir, tmp_path, argv, said):
    argv = [arg.format(run=run_dir, tmp=tmp_path) for arg in argv]
    status, _out, err = cli(*argv)
    assert status == 2
    assert said in err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("**/*.html"))


def test_every_subcommand_names_the_run_alike():
    parser = build_parser()
    actions = parser._subparsers._group_actions[0].choices  # the subcommands' parsers
    for name in ("summary", "plot", "report", "export"):
        usage = actions[name].format_usage()
        assert " RUN" in usage, (name, usage)
        assert " run " not in usage


def test_serve_on_a_taken_port_says_so_and_nothing_else(cli, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    with taken:
        status, _out, err = cli("serve", tmp_path, "--port", port)
    assert status == 2
    assert err.strip().splitlines() == [
        f"layerscope serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
