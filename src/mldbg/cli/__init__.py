"""The mldbg command line."""
