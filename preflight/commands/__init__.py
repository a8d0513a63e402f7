"""One module per subcommand; each has ``add_parser(subparsers)``."""
