"""One module per rankscope command: parse the options, build a config, call the library."""
