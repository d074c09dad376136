"""Entry point for `python -m mirror_core.train`."""
from mirror_core.train.cli import main

if __name__ == "__main__":
    main()
