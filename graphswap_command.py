"""The `graphswap` console command (setup.cfg's entry point): graphswap.cli's click group, started
without importing TensorFlow.

This module sits outside the graphswap package on purpose.  Importing graphswap.cli first runs
graphswap/__init__.py, which imports the whole API - TensorFlow among it, about 5 s - so that
`import graphswap` registers the swapped layers with Keras for keras.models.load_model().  The
command sets DEFER_API before that import; graphswap/__init__.py then defines only __version__
and loads the API on first attribute access (PEP 562), and graphswap.cli imports the
subpackages a command needs when it runs (those that touch a model register the layers).  So
`graphswap --help`, every --help, usage errors and `graphswap kernels` answer at once, and
`import graphswap` in a user's program keeps its eager registration.
"""

#: read by graphswap/__init__.py while this process's command line is being loaded
DEFER_API = False


def main():
    global DEFER_API
    DEFER_API = True
    from graphswap.cli import main as command

    return command()


if __name__ == "__main__":  # python -m graphswap_command ...
    main()
