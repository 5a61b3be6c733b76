"""The soak's audit of committed changelog transactions (a zombie's accepted commit shows as a
transaction reflecting an input position no later than an earlier one)."""

from bench.soak import out_of_order_commits


def test_commits_in_input_order_are_clean() -> None:
    # Three transactions, their commit markers at offsets 2 and 5.
    records = [(0, 10), (1, 10), (3, 25), (4, 25), (6, 40)]
    assert out_of_order_commits(records) == 0


def test_a_replayed_batch_after_a_marker_is_counted() -> None:
    # A zombie commits the batch up to 25 again after the new owner committed it: same header,
    # but a new transaction (the gap is the first one's commit marker).
    assert out_of_order_commits([(0, 10), (1, 25), (2, 25), (4, 25), (5, 25)]) == 1


def test_an_older_batch_after_a_newer_one_is_counted() -> None:
    assert out_of_order_commits([(0, 10), (2, 40), (4, 25), (6, 50), (8, 30)]) == 2


def test_records_without_the_header_say_nothing() -> None:
    assert out_of_order_commits([(0, None), (1, 10), (3, None), (4, 20)]) == 0
