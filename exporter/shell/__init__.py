"""The shell: the agent's loop, its history, the HTTP server, the command line and the demo; thin."""
