"""Run order: every server session runs its cells back to back, repeats in turn, order alternating."""
import itertools

import pytest

from specmatch.run_order import UPSTREAM, priority


@pytest.mark.parametrize("names,repeats", [(["baseline", "ngram", "eagle3"], 2), (["a"], 1),
                                           (["eagle3__recommended", "ngram__recommended"], 3),
                                           ([f"s{i}" for i in range(12)], 5)])
def test_one_priority_per_session_and_repeats_in_turn(names, repeats):
    p = {(s, r): priority(s, r, names, repeats) for s in names for r in range(1, repeats + 1)}
    assert len(set(p.values())) == len(p)  # no two sessions interleave their cells
    for r in range(1, repeats):  # all of repeat r before any of repeat r+1
        assert min(p[(s, r)] for s in names) > max(p[(s, r + 1)] for s in names)
    assert all(0 < v < UPSTREAM for v in p.values())  # everything upstream first


def test_order_alternates_between_repeats():
    names = ["baseline", "ngram", "eagle3"]
    def order(r):
        return sorted(names, key=lambda s: -priority(s, r, names, 3))
    assert order(1) == names and order(2) == names[::-1] and order(3) == names


def test_recommended_servers_do_not_share_a_priority():
    """The bug this module exists for: two recommended servers with one priority interleaved their
    cells, restarting a server for every cell."""
    derived = ["eagle3__recommended", "ngram_off_above_4__recommended"]
    for r in (1, 2):
        assert len({priority(s, r, derived, 2) for s in derived}) == 2


def test_unknown_server_or_repeat_is_an_error():
    with pytest.raises(ValueError, match="not among"):
        priority("x", 1, ["a"], 1)
    with pytest.raises(ValueError, match="outside"):
        priority("a", 3, ["a"], 2)
