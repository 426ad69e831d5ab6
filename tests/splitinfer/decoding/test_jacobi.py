from splitinfer.decoding.base import DecodingEnv, StepFeedback
from splitinfer.decoding.jacobi import Jacobi


def test_guesses_are_the_previous_outputs_shifted_past_the_accepted_prefix():
    p = Jacobi(block=5, seed=0)
    p.begin([1, 2], DecodingEnv(vocab_size=50))
    d = p.propose([1, 2, 3])
    assert len(d) == 4 and d.parents == (-1, 0, 1, 2)
    # nodes 0 and 1 accepted; node 1's output was the bonus; nodes 2 and 3 predict what follows it
    fb = StepFeedback(d, [d.tokens[1], 40, 41, 42], [0, 1], d.tokens[0], None, [0, 1, 2, 3])
    p.update([1, 2, 3], [d.tokens[0], d.tokens[1], 40], fb)
    assert p.guess == [41, 42]
    d2 = p.propose([1, 2, 3, d.tokens[0], d.tokens[1], 40])
    assert d2.tokens[:2] == (41, 42) and len(d2) == 4
