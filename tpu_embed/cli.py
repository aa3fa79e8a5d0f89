"""Console script `tpu-embed`: the command line lives in `pipelines.cli`."""
from pipelines.cli import main  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(main())
