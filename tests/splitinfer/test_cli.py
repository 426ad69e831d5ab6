import json

from splitinfer.cli import main


def test_generate_json_summary(capsys):
    rc = main(["generate", "--model", "tiny-random", "--split", "2,2", "--max-new-tokens", "6", "--rtt-ms", "1",
               "--bandwidth-mbps", "100", "--wire-dtype", "fp32", "--json", "Hello"])
    out = capsys.readouterr()
    assert rc == 0
    summary = json.loads(out.out.strip().splitlines()[-1])
    for key in ("text", "token_ids", "steps", "tokens_per_step", "tok_s", "bytes_sent", "bytes_received",
                "breakdown_ms"):
        assert key in summary
    assert summary["steps"] == len(summary["token_ids"]) <= 6
    assert "tok/s" in out.err
    assert summary["kernels"] == "default"


def test_generate_with_batch_invariant_kernels(capsys):
    argv = ["generate", "--model", "tiny-random", "--max-new-tokens", "8", "--wire-dtype", "fp32", "--json",
            "--decoding", "prompt-lookup", "the cat sat on the mat. the cat sat on the mat. the cat"]
    assert main(argv + ["--batch-invariant"]) == 0
    exact = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert exact["kernels"] == "batch-invariant" and exact["token_ids"] == plain["token_ids"]


def test_errors_are_one_line(capsys):
    for argv, msg in (
        (["generate", "--model", "tiny-random", "--split", "9,9", "hi"], "bad split 9,9"),
        (["generate", "--model", "nope", "hi"], "unknown model spec 'nope'"),
        (["generate", "--model", "tiny-random", "--split", "x", "hi"], "bad split 'x'"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("splitinfer: error:") and msg in err[0]


def test_an_unusable_output_path_is_one_line_not_a_traceback(tmp_path, capsys):
    in_the_way = tmp_path / "afile"
    in_the_way.write_text("x")
    for argv, needle in (
        (["bench", "run", "--suite", "ci", "--out", str(in_the_way)], "a file is in the way of a directory there"),
        (["bench", "run", "--suite", "ci", "--out", str(in_the_way / "sub")], "part of the path is a file"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"splitinfer: error: {in_the_way}") and needle in err[0], err


def test_decoding_report_only_names_a_file_that_is_not_a_decoding_run(tmp_path, capsys):
    for name, text in (("empty.json", ""), ("list.json", "[]"), ("suite.json", '{"suite": "quick"}')):
        (tmp_path / name).write_text(text)
        assert main(["bench", "decoding", "--report-only", str(tmp_path / name), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("splitinfer: error:") and name in err[0], err
