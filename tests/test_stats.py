"""The noise rule, the verdict sentences and the tables every notebook prints its results with."""
import pytest

import helpers as d2l
import report
import stats


def test_median_is_the_middle_or_the_mean_of_the_two_middles():
    assert stats.median([3, 1, 2]) == 2
    assert stats.median([4, 1, 3, 2]) == 2.5          # not the upper middle, 3
    assert stats.median([5.0]) == 5.0
    with pytest.raises(ValueError, match='empty'):
        stats.median([])


def test_measurement_uses_the_one_median():
    m = d2l.Measurement('x', [4.0, 1.0, 3.0, 2.0], 1, 'cpu')
    assert m.median == stats.median(m.times) == 2.5


def test_overlapping_repeats_are_no_difference_whatever_the_medians():
    c = stats.compare([1.0, 1.3, 2.0], [1.5, 1.9, 2.1], 'compiled', 'eager')
    assert c.overlap and not c.differs and c.a_is_better is None
    assert c.verdict.startswith('No difference measured between compiled and eager')
    assert 'spread of the repeats' in c.verdict


def test_a_difference_under_five_percent_is_no_difference_even_without_overlap():
    c = stats.compare([1.00, 1.01], [1.03, 1.04], 'a', 'b')
    assert not c.overlap and not c.differs
    assert '5%' in c.verdict and 'No difference measured' in c.verdict


def test_a_clear_difference_names_the_faster_side_and_its_factor():
    fast, slow = [1.0, 1.1, 1.05], [2.0, 2.2, 2.1]
    c = stats.compare(fast, slow, 'ring', 'naive')
    assert c.differs and c.a_is_better and c.factor == pytest.approx(2.1 / 1.05)
    assert c.verdict == ('Ring was 2.00x faster than naive (1.05 s against 2.1 s; the repeats '
                         'do not overlap).')
    assert stats.compare(slow, fast, 'naive', 'ring').verdict.startswith(
        'Naive was 2.00x slower than ring')


def test_single_measurements_fall_back_to_the_five_percent_rule():
    assert not stats.compare(1.0, 1.04, 'a', 'b').differs
    c = stats.compare(1.0, 1.2, 'a', 'b')
    assert c.differs and 'single measurements' in c.verdict


def test_values_other_than_times_read_as_a_ratio_and_know_which_way_is_better():
    c = stats.compare([0.5], [1.0], 'FSDP', 'DDP', lower_is_better=True, unit='B')
    assert c.verdict.startswith('FSDP measured 0.50x DDP') and c.a_is_better
    acc = stats.compare([0.9, 0.91], [0.6, 0.62], 'k=1', 'k=2', lower_is_better=False, unit='')
    assert acc.a_is_better and 'measured 1.48x' in acc.verdict


def test_compare_takes_measurements_and_their_labels():
    a = d2l.Measurement('eager', [1e-5, 1.1e-5, 1.2e-5], 1, 'cpu')
    b = d2l.Measurement('compiled', [3e-5, 3.1e-5, 3.3e-5], 1, 'cpu')
    c = stats.compare(a, b)
    assert (c.a, c.b) == ('eager', 'compiled') and '11 us against 31 us' in c.verdict
    with pytest.raises(ValueError, match='needs a name'):
        stats.compare([1.0], [2.0])


def test_against_model_agrees_within_its_tolerance_and_says_by_how_much_otherwise():
    assert stats.against_model('bytes', 1.02e6, 1e6, tolerance=0.03).agrees
    off = stats.against_model('idle fraction', 0.5, 0.4, unit='%')
    assert not off.agrees and off.verdict == ('The measured idle fraction, 50%, is 25% above '
                                              'the model\'s 40%.')
    with pytest.raises(ValueError, match='predicts 0'):
        stats.against_model('x', 1, 0)


def test_fit_line_recovers_a_line_and_refuses_too_little_data():
    b, m = stats.fit_line([1, 2, 3, 4], [3, 5, 7, 9])
    assert (b, m) == pytest.approx((1, 2))
    with pytest.raises(ValueError):
        stats.fit_line([1], [2])
    with pytest.raises(ValueError, match='distinct'):
        stats.fit_line([2, 2], [1, 3])


def test_format_value_units():
    assert stats.format_value(1.5e-5, 's') == '15 us'
    assert stats.format_value(0.9999e-3, 's') == '1 ms'
    assert stats.format_value(0.457, '%') == '46%' and stats.format_value(0.0049, '%') == '0.5%'
    assert stats.format_value(12345.6, 'B') == '12,346 B'
    assert stats.format_value(3.14159) == '3.14'


def test_tables_render_rows_with_units_and_refuse_nothing(capsys):
    text = report.markdown_table({'eager': {'time': 1e-3, 'share': 0.5},
                                  'compiled': {'time': 2e-3, 'share': None}},
                                 units={'time': 's', 'share': '%'})
    assert text.splitlines() == ['|  | time | share |', '|---|---|---|',
                                 '| eager | 1 ms | 50% |', '| compiled | 2 ms |  |']
    report.table([{'k': 1, 'ok': True}], title='Runs')
    assert capsys.readouterr().out == '**Runs**\n\n| k | ok |\n|---|---|\n| 1 | True |\n'
    with pytest.raises(ValueError):
        report.markdown_table([])


def test_say_prints_one_verdict(capsys):
    report.say(stats.compare([1.0], [3.0], 'a', 'b'))
    assert capsys.readouterr().out.startswith('A was 3.00x faster than b')


def test_bars_draws_one_bar_per_group_and_series_with_a_legend():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig = report.bars({'MLP': {'eager': 1.0, 'compiled': 0.5}, 'chain': {'eager': 1.0}},
                      'speedup', reference=1, log=True)
    ax = fig.axes[0]
    assert len(ax.patches) == 4 and [t.get_text() for t in ax.get_legend().get_texts()] == [
        'eager', 'compiled']
    assert [t.get_text() for t in ax.get_xticklabels()] == ['MLP', 'chain']
    plt.close(fig)


def test_fit_line_robust_ignores_an_outlier_that_tilts_least_squares():
    x, y = [1, 2, 4, 8, 16], [3.0, 5.0, 9.0, 17.0, 33.0]       # y = 1 + 2x exactly
    assert stats.fit_line_robust(x, y) == pytest.approx((1.0, 2.0))
    disturbed = y[:-1] + [60.0]                                  # one slow timing
    assert stats.fit_line_robust(x, disturbed)[1] == pytest.approx(2.0)
    assert stats.fit_line(x, disturbed)[1] > 3.0
    with pytest.raises(ValueError, match='distinct'):
        stats.fit_line_robust([2, 2], [1.0, 3.0])
    with pytest.raises(ValueError, match='two or more'):
        stats.fit_line_robust([1], [1.0])


def test_a_zero_median_gives_a_verdict_instead_of_a_crash():
    c = stats.compare([0.0, 0.0], [1.0, 1.1], 'nothing', 'something', unit='')
    assert c.differs and c.ratio == float('inf') and 'measured 0.00x' in c.verdict
    same = stats.compare([0.0], [0.0], 'a', 'b', unit='')
    assert not same.differs and same.verdict.startswith('No difference measured')


def test_large_factors_read_as_a_person_writes_them():
    assert '1,548x faster' in stats.compare([1.0], [1548.0], 'a', 'b').verdict
    assert '14.5x faster' in stats.compare([1.0], [14.5], 'a', 'b').verdict


def test_compare_paired_calls_a_difference_only_when_every_repeat_agrees():
    faster = stats.compare_paired([1.10, 1.20, 1.08], 'our ring', 'gloo')
    assert faster.differs and faster.a_is_better is True and faster.ratio == pytest.approx(1.10)
    assert faster.verdict == ('Our ring was 1.10x faster than gloo (median of 3 paired repeats, '
                              'in which gloo took 1.08x to 1.20x the time of our ring).')
    slower = stats.compare_paired([0.80, 0.90, 0.85], 'our ring', 'gloo')
    assert slower.a_is_better is False and '1.18x slower' in slower.verdict
    # a median outside the band, but one repeat inside it: no difference
    mixed = stats.compare_paired([0.93, 1.13, 1.20], 'our ring', 'gloo')
    assert not mixed.differs and mixed.a_is_better is None and mixed.ratio > 1.05
    assert mixed.verdict.startswith('No difference measured between our ring and gloo')
    assert 'over 3 paired repeats, gloo took 0.93x to 1.20x the time of our ring' in mixed.verdict
    assert stats.compare_paired([1.04], 'a', 'b').a_is_better is None  # within 5%, one repeat
    assert mixed.band == (1 - stats.NOISE_FLOOR, 1 + stats.NOISE_FLOOR)
    with pytest.raises(ValueError, match='at least one ratio'):
        stats.compare_paired([], 'a', 'b')
    with pytest.raises(ValueError, match='positive and finite'):
        stats.compare_paired([1.0, float('nan')], 'a', 'b')


def test_compare_refuses_times_at_or_below_zero():
    """01's GPU run printed "no difference" between -14.2 us and -23.7 us: a subtraction that
    went negative must fail where it is judged, not read as a result."""
    with pytest.raises(ValueError, match='compiled'):
        stats.compare([-14.2e-6], [-23.7e-6], 'compiled', 'eager')
    with pytest.raises(ValueError, match='eager'):
        stats.compare([1e-6], [0.0], 'compiled', 'eager')
    stats.compare([-1.0], [2.0], 'a', 'b', unit='')  # not times: a sign is allowed


def test_a_single_measurement_within_the_other_sides_repeats_is_no_difference():
    """03 once set one profiled run against five unprofiled rounds (75 to 228 ms) and called
    the single run 2.29x faster: the spread of the side that has repeats counts too."""
    within = stats.compare([0.1], [0.075, 0.09, 0.12, 0.2, 0.228], 'profiled', 'alone')
    assert not within.differs and 'No difference measured' in within.verdict
    outside = stats.compare([0.05], [0.075, 0.09, 0.12, 0.2, 0.228], 'profiled', 'alone')
    assert outside.differs and "outside the other side's repeats" in outside.verdict


def test_a_gap_against_a_model_is_not_rounded_onto_its_tolerance():
    """07 printed "10% below the model" for a gap of 10.1%, beside a 10% tolerance."""
    off = stats.against_model('ring time', 74.4e-3, 82.8e-3, tolerance=0.1, unit='s')
    assert not off.agrees and '10.1% below' in off.verdict


def test_a_model_within_the_spread_of_the_repeats_agrees():
    """04 printed "268 GFLOP/s is 20% below the model's 333" for repeats of 4.6, 268 and 377."""
    within = stats.against_model('float32 rate', [4.6e9, 268e9, 377e9], 333e9)
    assert within.agrees and 'within the spread of the repeats' in within.verdict
    outside = stats.against_model('float32 rate', [250e9, 268e9, 280e9], 333e9)
    assert not outside.agrees and '19.5% below' in outside.verdict
    assert not stats.against_model('x', 268e9, 333e9).agrees  # one value: no spread to lie in
