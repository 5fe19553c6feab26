"""Execute a notebook with papermill, its kernel started the way jupyter advises.

    python scripts/execute.py NOTEBOOK OUTPUT [--cwd DIR] [-p NAME VALUE ...]   (make run)

A Jupyter kernel talks to whoever started it over ZeroMQ sockets on TCP. Since ipykernel 7,
a kernel whose sockets are not encrypted says so at every start ("Kernel is running over TCP
without encryption ... susceptible to eavesdropping. Use IPC transport or launch with kernel
manager-provisioned CurveZMQ keys"), on the console of whoever started it. jupyter_client's
KernelManager provisions those keys when asked (`transport_encryption`, here 'auto': when the
kernel's kernelspec declares that it supports them, as ipykernel's does), and the kernel then
encrypts its sockets and has nothing to warn about. IPC transport would do too, but only where
Unix sockets exist (not on Windows) and it leaves socket files beside the connection file.

KERNELS is that setting. `make run` (this script), the tests (nbmake, papermill and the
refusal kernel in tests/conftest.py) and `make sweep` pass it to every kernel they start;
`make lab` passes the same setting on JupyterLab's command line.
"""
import argparse
import sys
import time
from pathlib import Path

from traitlets.config import Config

KERNELS = Config({'KernelManager': {'transport_encryption': 'auto'}})


def typed(text):
    """A -p value as papermill's own -p reads it: True, False, None, an int, a float, or text."""
    named = {'True': True, 'False': False, 'None': None}
    if text in named:
        return named[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('notebook', type=Path)
    parser.add_argument('output', type=Path)
    parser.add_argument('--cwd', type=Path, help='the kernel\'s working directory')
    parser.add_argument('-p', nargs=2, action='append', default=[], metavar=('NAME', 'VALUE'),
                        help='a parameter, its value read as papermill reads it')
    args = parser.parse_args(argv)
    import papermill
    parameters = {name: typed(value) for name, value in args.p}
    tik = time.monotonic()
    papermill.execute_notebook(str(args.notebook), str(args.output), parameters=parameters,
                               cwd=str(args.cwd) if args.cwd else None, progress_bar=False,
                               config=KERNELS)
    print(f'   ran in {time.monotonic() - tik:.0f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
