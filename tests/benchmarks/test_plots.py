import pytest

from benchmarks import plots

PNG = b"\x89PNG"


def test_every_plot_writes_a_png_and_skips_without_data(tmp_path):
    written = [
        plots.plot_recovery_vs_depth([{"attack": "mlp", "depth": d, "value": 0.5, "ci_low": 0.4, "ci_high": 0.6}
                                      for d in (1, 4)], {"unigram": 0.05}, tmp_path / "depth.png", "recovery"),
        plots.plot_pii([{"attack": "mlp", "type": t, "value": 0.3} for t in ("person", "email")], tmp_path / "pii.png"),
        plots.plot_breakdown([{"label": "seq", "breakdown_ms": {"network_ms": 80.0, "body_ms": 5.0}}],
                             tmp_path / "breakdown.png"),
        plots.plot_tau([{"decoding": d, "category": "code", "tau": t} for d, t in (("sequential", 1.0),
                                                                                ("combined", 2.1))],
                       tmp_path / "tau.png"),
        plots.plot_throughput_vs_rtt([{"label": "sequential", "projected": [(5, 20.0), (80, 10.0)],
                                       "measured": [(20, 15.0)]}], tmp_path / "rtt.png"),
    ]
    for path in written:
        assert path is not None and path.read_bytes()[:4] == PNG and path.stat().st_size > 5000, path


@pytest.mark.parametrize("fn, args", [
    (plots.plot_recovery_vs_depth, ([], {}, None, "t")), (plots.plot_pii, ([],)),
    (plots.plot_breakdown, ([],)), (plots.plot_tau, ([],)), (plots.plot_throughput_vs_rtt, ([],))])
def test_no_data_no_file(tmp_path, fn, args):
    out = tmp_path / "x.png"
    args = tuple(out if a is None else a for a in args)
    assert (fn(*args, out) if len(args) == 1 else fn(args[0], args[1], out, args[3])) is None
    assert not out.exists()
