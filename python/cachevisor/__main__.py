"""`python -m cachevisor sweep SPEC.toml [--ray ADDRESS]`: the package's command line
(what the `cachevisor sweep` command of the Rust CLI runs)."""

import sys


def main() -> int:
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m cachevisor sweep SPEC.toml [--out DIR] [--jobs N] [--ray ADDRESS]")
        return 0 if argv else 2
    if argv[0] != "sweep":
        print(f"error: unknown command `{argv[0]}` (expected sweep)", file=sys.stderr)
        return 2
    from .sweep import main as sweep_main

    return sweep_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
