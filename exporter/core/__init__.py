"""The pure core: values, the fold (`advance`) and the judge (`judge`), grammars, saved-log formats, reports.

No clock, no files, no sockets, no host libraries (systemd, psutil, pynvml, sqlite3): everything here is
a function of its arguments, so `serve`, `status`, `wait` and `replay` feed the same core
(tests/test_rings.py holds this line).
"""
