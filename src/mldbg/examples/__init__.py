"""Small models bundled for the tutorial, the demo and the tests."""
