"""Test harnesses for users of the model: the peer-client conformance kit (conformance.py)
and its pytest plugin (pytest_plugin.py).  Like scenarios/, this sits above every layer."""
