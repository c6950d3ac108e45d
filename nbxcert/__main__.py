"""`python -m nbxcert` runs the same CLI as the `nbxcert` console script."""

from nbxcert.cli import main

if __name__ == "__main__":
    main()
