"""Tests of the local cluster itself (localkube): components, operator env, the real node."""
