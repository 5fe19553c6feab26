"""What every notebook's plan shares: the time budgets, and the records of a plan and a setup.

Every notebook promises to finish within a time budget wherever it runs: about a minute on a
laptop CPU (60 s for notebooks 01-04, 90 s for 05-09) and about five minutes on a GPU, from a
Colab T4 to an H100. It keeps that promise by measuring the machine briefly (hardware.probe)
and asking its plan (`plan_NN.plan_for(machine)`) what to run: the sizes, and an estimate of
the time and memory they need. The plans take a `hardware.Machine`, so tests plan for machines
that are not there (`hardware.DESCRIBED`). The book's full scale is always one parameter away.
"""
import math
from dataclasses import dataclass, field

from hardware import BUSY_SHARE

BUDGET_S = {'cpu': {'01': 60, '02': 60, '03': 60, '04': 60, '05': 90, '06': 90, '07': 90,
                    '08': 90, '09': 90},
            'cuda': 300}


def budget(notebook, machine):
    """Seconds the notebook may take on `machine`."""
    return BUDGET_S['cuda'] if machine.kind == 'cuda' else BUDGET_S['cpu'][notebook]


@dataclass
class Plan:
    """Defaults chosen for a machine, with the estimate that chose them."""
    values: dict
    seconds: float                 # estimated time of the notebook's sized work on that machine
    device_bytes: int = 0          # estimated peak memory on the computing device
    host_bytes: int = 0            # estimated peak host memory
    why: str = ''
    notes: list = field(default_factory=list)

    def __getitem__(self, name):
        return self.values[name]

    def __str__(self):
        chosen = ', '.join(f'{k}={v}' for k, v in self.values.items())
        return (f'chosen for this machine: {chosen} (about {self.seconds:.0f} s of work). '
                f'{self.why}').strip()


def largest_fitting(candidates, seconds, limit_s, bytes_needed=None, limit_bytes=math.inf):
    """The first of `candidates` (largest first) whose seconds(c) fits `limit_s` and whose
    bytes_needed(c) fits `limit_bytes`; the last one when none does."""
    for c in candidates:
        if seconds(c) <= limit_s and (bytes_needed is None or bytes_needed(c) <= limit_bytes):
            return c
    return candidates[-1]


BUSY = ('The probe ran while other programs took {share:.0%} of the CPU (measured twice): '
        'the sizes chosen may be smaller than this machine allows when idle.')


class Setup:
    """What a notebook's setup cell resolved: every parameter's final value (as attributes:
    `cfg.chain_numel`), the machine, the plan, and `why`, the few lines it prints. Each
    notebook's `plan_NN.setup(...)` checks every parameter first (a ValueError naming the
    culprit, before any work), then probes the machine, sizes the work and picks the devices.
    When the probe found the machine busy, the printout says so (BUSY)."""

    def __init__(self, why, **values):
        self.__dict__.update(values)
        self.why = list(why)

    def __str__(self):
        busy = getattr(getattr(self, 'machine', None), 'busy', None)
        warn = [BUSY.format(share=busy)] if busy is not None and busy > BUSY_SHARE else []
        return '\n'.join(self.why + warn)
