"""``python -m lit_rlft.cli fit --config ...``: the ``lit-rlft`` command (for ``torchrun -m``)."""

from lit_rlft.cli.main import main

if __name__ == "__main__":
    main()
