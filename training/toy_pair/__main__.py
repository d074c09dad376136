"""`python -m training.toy_pair --out DIR`: train the toy pair (cli.py)."""
from training.toy_pair.cli import main

if __name__ == "__main__":
    main()
