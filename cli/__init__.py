"""rankscope.cli: the ``rankscope`` command. Parses arguments, builds configs, calls the library."""
