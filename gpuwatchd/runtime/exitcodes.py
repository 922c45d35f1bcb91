"""Exit codes of the `gpuwatchd` command that scripts and systemd can rely on (also in --help and README.md)."""

EXIT_OK = 0
EXIT_CONFIG_INVALID = 1  # the config file (or --listen) is not valid; messages name the key path
EXIT_USAGE = 2  # bad command line, or a config file that does not exist (argparse uses 2 as well)
EXIT_UNREACHABLE = 3  # status: no daemon answered at the URL
EXIT_LISTEN = 4  # run: cannot bind the listen address (in use, no permission)
EXIT_STATE_DIR = 5  # run: the state directory cannot be written
EXIT_RUNTIME = 6  # run: a core part of the daemon failed; systemd restarts it
EXIT_BROKEN_PIPE = 141  # stdout was closed by its reader (`| head`): 128 + SIGPIPE, what a shell shows for `cat`

EXIT_CODES_HELP = """\
exit codes:
  0  success (run: stopped cleanly by SIGTERM/SIGINT)
  1  invalid configuration; one "key.path: message" line per problem on stderr
  2  usage error, or the config file does not exist
  3  status: no daemon reachable at the URL
  4  run: cannot listen on the address (in use or not permitted)
  5  run: state directory not writable
  6  run: an internal part of the daemon failed (systemd restarts it)
  141  the reader of the output went away (`| head`): stopped quietly
"""
