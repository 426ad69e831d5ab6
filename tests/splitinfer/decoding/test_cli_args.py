import argparse
import json

import pytest

from splitinfer.cli import main
from splitinfer.decoding.cli_args import DecodingFlags, add_decoding_args
from splitinfer.errors import SplitInferError


def parse(*argv):
    p = argparse.ArgumentParser()
    add_decoding_args(p)
    return p.parse_args(list(argv))


def test_flags_and_key_value_options():
    args = parse("--decoding", "combined", "--draft-budget", "16", "--decoding-option", "rtt_ms=80",
                 "--decoding-option", "lookahead=off", "--decoding-option", "adaptive=false")
    flags = DecodingFlags.from_args(args)
    assert flags.name == "combined"
    assert flags.options == {"draft_budget": 16, "rtt_ms": 80, "lookahead": "off", "adaptive": False}
    assert DecodingFlags.from_args(parse()) == DecodingFlags()
    with pytest.raises(SplitInferError, match="KEY=VALUE"):
        DecodingFlags.from_args(parse("--decoding-option", "alpha"))


def test_generate_cli_with_a_proposer_prints_decoding_metrics(capsys):
    rc = main(["generate", "--model", "tiny-random", "--max-new-tokens", "12", "--decoding", "prompt-lookup",
               "--draft-budget", "4", "--wire-dtype", "fp32", "--json", "ab ab ab ab ab"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("tokens_per_step", "draft_acceptance_rate", "tokens_sent_per_step", "bytes_per_step",
                "modelled_tok_s", "tok_s"):
        assert key in s
    assert s["decoding"] == "prompt-lookup" and s["new_tokens"] == 12


def test_generate_cli_rejects_options_the_proposer_does_not_take(capsys):
    assert main(["generate", "--model", "tiny-random", "--decoding", "jacobi", "--window", "3", "x"]) == 2
    assert "does not take option(s) window" in capsys.readouterr().err


def test_draft_rtt_ms_sets_the_sizing_rtt_and_help_says_tau_depends_on_it(capsys):
    assert DecodingFlags.from_args(parse("--decoding", "combined", "--draft-rtt-ms", "80")).options == {"rtt_ms": 80.0}
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--draft-rtt-ms" in text and "tau, the tokens per round trip, depends on it" in text
    assert main(["generate", "--model", "tiny-random", "--decoding", "jacobi", "--draft-rtt-ms", "80", "x"]) == 2
    assert "does not take option(s) rtt_ms" in capsys.readouterr().err
