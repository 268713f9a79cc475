"""Test harnesses for users of the model: the peer-client conformance kit (conformance.py),
the ladder of a race test (ladder.py), the race-test author's accessors and call recorder
(api.py) and the pytest plugin (pytest_plugin.py).  Like scenarios/, this sits above
every layer."""
