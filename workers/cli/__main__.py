"""``python -m workers.cli``: the same as the ``recap`` console script."""

from recap.workers.cli import main

if __name__ == "__main__":
    main()
