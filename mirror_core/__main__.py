import sys

from mirror_core.cli import main

if __name__ == "__main__":
    sys.exit(main())
