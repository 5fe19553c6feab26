"""Statistics for the course's measurements, and the one noise rule every comparison obeys.

The noise rule: two measurements differ only when the difference of their medians is larger
than the spread of their repeats (their ranges do not overlap) and larger than 5%. Anything
less is reported as "no difference measured", and no mechanism is ever offered for it.

`compare` applies the rule and returns a `Comparison`, whose `verdict` is the one computed
sentence a notebook may print about a result (report.say shows it). The sentences come from
the readable templates below, never from fragments assembled in a notebook.
"""
import math
from dataclasses import dataclass

NOISE_FLOOR = 0.05  # a relative difference below this is noise, repeats or not


def median(values):
    """The median of a non-empty sequence (the mean of the two middle values when even)."""
    s = sorted(values)
    if not s:
        raise ValueError('median of an empty sequence')
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def spread(values):
    """(smallest, largest) of the repeats."""
    return min(values), max(values)


def samples(x):
    """The repeats behind a measurement: a helpers.Measurement's times, a sequence's values,
    or a single number as a one-element tuple."""
    if hasattr(x, 'times'):
        return tuple(x.times)
    if isinstance(x, (int, float)):
        return (float(x),)
    values = tuple(float(v) for v in x)
    if not values:
        raise ValueError('a measurement needs at least one value')
    return values


def fit_line(x, y):
    """Least-squares (intercept, slope) of y = intercept + slope * x."""
    n = len(x)
    if n < 2 or n != len(y):
        raise ValueError(f'fit_line needs two or more (x, y) pairs, got {len(x)} and {len(y)}')
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx == 0:
        raise ValueError('fit_line needs at least two distinct x values')
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    return my - slope * mx, slope


def format_value(x, unit=''):
    """A number as a reader wants it: seconds as '15 us' or '1.2 s' (unit 's'), a share as
    '46%' (unit '%'), anything else to three significant digits with its unit."""
    if unit == 's':
        for name, scale in (('s', 1), ('ms', 1e-3), ('us', 1e-6)):
            if abs(float(f'{x:.3g}')) >= scale:
                return f'{float(f"{x:.3g}") / scale:.3g} {name}'
        return f'{x / 1e-9:.3g} ns'
    if unit == '%':
        return f'{x:.0%}' if abs(x) >= 0.095 else f'{x:.1%}'
    text = f'{x:,.0f}' if abs(x) >= 1000 else f'{x:.3g}'
    return f'{text} {unit}'.strip()


# What a verdict says, one template per outcome. {a} and {b} are the two names, {x} and {y}
# their medians as formatted values, {factor} the larger median over the smaller.
TEMPLATES = {
    'same': 'No difference measured between {a} and {b}: {x} against {y} is within {noise}.',
    'faster': '{a} was {factor}x faster than {b} ({x} against {y}; {evidence}).',
    'slower': '{a} was {factor}x slower than {b} ({x} against {y}; {evidence}).',
    'ratio': '{a} measured {ratio}x {b} ({x} against {y}; {evidence}).',
}
NOISE = {
    'spread': 'the spread of the repeats',
    'floor': f'{NOISE_FLOOR:.0%}, the smallest difference this course reports',
}
EVIDENCE = {
    'repeats': 'the repeats do not overlap',
    'one_side': 'the single measurement lies outside the other side\'s repeats',
    'single': 'single measurements, so only the 5% rule applies',
}


@dataclass(frozen=True)
class Comparison:
    """Two measurements set side by side under the noise rule (a is the subject)."""
    a: str
    b: str
    a_values: tuple
    b_values: tuple
    lower_is_better: bool = True
    unit: str = 's'

    @property
    def a_median(self):
        return median(self.a_values)

    @property
    def b_median(self):
        return median(self.b_values)

    @property
    def ratio(self):
        """b's median over a's: for times, how many times faster a ran than b (inf when a's
        median is 0, nan when both are)."""
        return _divide(self.b_median, self.a_median)

    @property
    def factor(self):
        """The larger median over the smaller (1 or more)."""
        hi, lo = max(self.a_median, self.b_median), min(self.a_median, self.b_median)
        return _divide(hi, lo)

    @property
    def overlap(self):
        """Whether the ranges of the repeats overlap; where only one side has repeats, whether
        the other's single value lies within them (False without repeats on either side)."""
        (a_lo, a_hi), (b_lo, b_hi) = spread(self.a_values), spread(self.b_values)
        if len(self.a_values) == 1 == len(self.b_values):
            return False
        return max(a_lo, b_lo) <= min(a_hi, b_hi)

    @property
    def differs(self):
        """The noise rule: outside the repeats' spread and more than NOISE_FLOOR apart."""
        return not self.overlap and self.factor - 1 > NOISE_FLOOR

    @property
    def a_is_better(self):
        """Whether a came out better (None when no difference was measured)."""
        if not self.differs:
            return None
        return (self.a_median < self.b_median) == self.lower_is_better

    @property
    def verdict(self):
        """The one sentence a notebook prints about this comparison."""
        x, y = format_value(self.a_median, self.unit), format_value(self.b_median, self.unit)
        if not self.differs:
            return TEMPLATES['same'].format(a=self.a, b=self.b, x=x, y=y,
                                            noise=NOISE['spread' if self.overlap else 'floor'])
        outcome = ('ratio' if self.unit != 's' else
                   'faster' if self.a_median < self.b_median else 'slower')
        return _sentence(TEMPLATES[outcome].format(
            a=self.a, b=self.b, x=x, y=y, factor=_times(self.factor),
            ratio=_times(_divide(self.a_median, self.b_median)),
            evidence=EVIDENCE[self.evidence]))

    @property
    def evidence(self):
        """Which repeats the verdict rests on: 'repeats' (both sides), 'one_side', 'single'."""
        counts = sorted((len(self.a_values), len(self.b_values)))
        return 'repeats' if counts[0] > 1 else 'one_side' if counts[1] > 1 else 'single'

    def __str__(self):
        return self.verdict


def _times(x):
    """A factor as a person writes it: 2.25, 14.5, 1,548."""
    return f'{x:.2f}' if abs(x) < 10 else f'{x:.1f}' if abs(x) < 100 else f'{x:,.0f}'


def _divide(x, y):
    """x / y, with x / 0 as inf (nan for 0 / 0): a median of zero must not crash a verdict."""
    if y == 0:
        return math.nan if x == 0 else math.copysign(math.inf, x)
    return x / y


def _sentence(text):
    """A verdict starts with a capital, whatever name it starts with."""
    return text[:1].upper() + text[1:]


def compare(a, b, a_name=None, b_name=None, lower_is_better=True, unit='s'):
    """Set measurement `a` beside `b` under the noise rule.

    a, b: a helpers.Measurement (its repeats are used), a sequence of repeats, or one number.
    Names default to the Measurements' labels. Times (unit 's') read "a was 1.52x faster than
    b"; any other unit ('', 'GB/s', '%') reads "a measured 0.66x b". lower_is_better says which
    way a_is_better points, for code that must choose (a plot's colour, an assertion)."""
    names = [n if n is not None else getattr(m, 'label', None)
             for n, m in ((a_name, a), (b_name, b))]
    if None in names:
        raise ValueError('compare needs a name for each side (a_name, b_name)')
    values = samples(a), samples(b)
    if unit == 's':  # a time at or below zero is a subtraction gone wrong, not a measurement
        for name, v in zip(names, values):
            if min(v) <= 0:
                raise ValueError(f'compare: a time <= 0 for {name}: {min(v)!r}')
    return Comparison(names[0], names[1], *values, lower_is_better, unit)


# What a measurement against a model or a bound says.
MODEL_TEMPLATES = {
    'agrees': 'The measured {what}, {x}, agrees with the model\'s {y} (within {tol:.0%}).',
    'spread': ('The measured {what}, {x}, agrees with the model\'s {y}: the model lies within the '
               'spread of the repeats ({lo} to {hi}).'),
    'above': 'The measured {what}, {x}, is {off} above the model\'s {y}.',
    'below': 'The measured {what}, {x}, is {off} below the model\'s {y}.',
}


@dataclass(frozen=True)
class AgainstModel:
    what: str
    measured: float
    model: float
    tolerance: float = NOISE_FLOOR
    unit: str = ''
    values: tuple = ()   # the repeats behind `measured` (their median), if any

    @property
    def within_spread(self):
        """Whether the model lies within the repeats' range (the noise rule; False for one)."""
        return len(self.values) > 1 and min(self.values) <= self.model <= max(self.values)

    @property
    def off(self):
        """(measured - model) / model."""
        return (self.measured - self.model) / self.model

    @property
    def agrees(self):
        """Within the tolerance, or within the spread of the repeats."""
        return abs(self.off) <= self.tolerance or self.within_spread

    @property
    def verdict(self):
        outcome = ('agrees' if abs(self.off) <= self.tolerance else 'spread' if self.within_spread
                   else 'above' if self.off > 0 else 'below')
        lo, hi = (format_value(v, self.unit) for v in spread(self.values or (self.measured,)))
        return MODEL_TEMPLATES[outcome].format(
            what=self.what, x=format_value(self.measured, self.unit),
            y=format_value(self.model, self.unit), tol=self.tolerance, off=_gap(abs(self.off)),
            lo=lo, hi=hi)

    def __str__(self):
        return self.verdict


def _gap(share):
    """A relative gap as a person writes it, exact enough not to read as the tolerance: 10.1%,
    46%, 250%."""
    return f'{share:.1%}' if share < 0.1995 else f'{share:.0%}'


def against_model(what, measured, model, tolerance=NOISE_FLOOR, unit=''):
    """A measurement set beside what a model (a formula, a paper's accounting) predicts. With
    repeats (a Measurement or a sequence), the model agrees when it lies within their spread,
    as the noise rule has it, whatever the median's distance."""
    if model == 0:
        raise ValueError(f'the model predicts 0 for {what}: nothing to compare against')
    values = samples(measured)
    return AgainstModel(what, float(median(values)), float(model), tolerance, unit, values)


def fit_line_robust(x, y):
    """(intercept, slope) of y = intercept + slope * x by Theil and Sen: the slope is the
    median of the slopes between every pair of points with distinct x, the intercept the
    median of y - slope * x. A few points disturbed by other work cannot tilt it as they
    tilt least squares (fit_line)."""
    n = len(x)
    if n < 2 or n != len(y):
        raise ValueError(f'fit_line_robust needs two or more (x, y) pairs, got {len(x)} and '
                         f'{len(y)}')
    slopes = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(n) for j in range(i + 1, n)
              if x[j] != x[i]]
    if not slopes:
        raise ValueError('fit_line_robust needs at least two distinct x values')
    slope = median(slopes)
    return median([b - slope * a for a, b in zip(x, y)]), slope


# What a verdict on paired repeats says. {a} and {b} are the names, {ratio} the median of b's
# time over a's, {lo} and {hi} the smallest and largest of those ratios, {k} how many.
PAIRED_TEMPLATES = {
    'same': ('No difference measured between {a} and {b}: over {k} paired repeats, {b} took '
             '{lo}x to {hi}x the time of {a}, not all more than {noise:.0%} from 1 on one side.'),
    'faster': ('{a} was {factor}x faster than {b} (median of {k} paired repeats, in which {b} '
               'took {lo}x to {hi}x the time of {a}).'),
    'slower': ('{a} was {factor}x slower than {b} (median of {k} paired repeats, in which {b} '
               'took {lo}x to {hi}x the time of {a}).'),
}


@dataclass(frozen=True)
class PairedComparison:
    """Two things timed in pairs (each repeat runs both, one right after the other, so a busy
    moment slows both alike), judged by their ratios: b's time over a's, one per repeat."""
    a: str
    b: str
    ratios: tuple

    @property
    def ratio(self):
        """The median of b's time over a's: above 1, a was faster."""
        return median(self.ratios)

    @property
    def band(self):
        """The ratios that count as no difference: within NOISE_FLOOR of 1."""
        return 1 - NOISE_FLOOR, 1 + NOISE_FLOOR

    @property
    def differs(self):
        """Every repeat's ratio beyond the band, all on the same side."""
        lo, hi = spread(self.ratios)
        return lo > self.band[1] or hi < self.band[0]

    @property
    def a_is_better(self):
        """Whether a took less time (None when no difference was measured)."""
        return self.ratio > 1 if self.differs else None

    @property
    def verdict(self):
        lo, hi = spread(self.ratios)
        words = {'a': self.a, 'b': self.b, 'lo': f'{lo:.2f}', 'hi': f'{hi:.2f}',
                 'k': len(self.ratios), 'noise': NOISE_FLOOR}
        if not self.differs:
            return _sentence(PAIRED_TEMPLATES['same'].format(**words))
        outcome = 'faster' if self.a_is_better else 'slower'
        factor = self.ratio if self.a_is_better else _divide(1, self.ratio)
        return _sentence(PAIRED_TEMPLATES[outcome].format(factor=_times(factor), **words))

    def __str__(self):
        return self.verdict


def compare_paired(ratios, a_name, b_name):
    """Judge a against b from paired repeats: `ratios` holds b's time over a's, one per repeat
    (above 1: a was faster in that repeat). A difference is measured only when every ratio lies
    more than NOISE_FLOOR from 1, all on the same side; the size reported is their median.
    Returns a PairedComparison (.verdict, .a_is_better, .ratio, .differs, .band)."""
    values = tuple(float(r) for r in ratios)
    if not values:
        raise ValueError('compare_paired needs at least one ratio')
    if any(not math.isfinite(r) or r <= 0 for r in values):
        raise ValueError(f'paired ratios must be positive and finite, got {values}')
    return PairedComparison(a_name, b_name, values)
