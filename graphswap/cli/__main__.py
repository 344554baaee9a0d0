"""`python -m graphswap.cli ...`: the command line, as the `graphswap` command runs it."""

from graphswap.cli.group import main

if __name__ == "__main__":  # pragma: no cover
    main()
